package main

import "context"

// runServe is a placeholder until its room is built; replace this file with serve.go.
func runServe(ctx context.Context, e env, args []string) error { return errNotBuilt }
