package main

import "context"

// runConsume is a placeholder until its room is built; replace this file with consume.go.
func runConsume(ctx context.Context, e env, args []string) error { return errNotBuilt }
