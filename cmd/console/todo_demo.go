package main

import "context"

// runDemo is a placeholder until its room is built; replace this file with demo.go.
func runDemo(ctx context.Context, e env, args []string) error { return errNotBuilt }
