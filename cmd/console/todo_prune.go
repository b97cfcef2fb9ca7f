package main

import "context"

// runPrune is a placeholder until its room is built; replace this file with prune.go.
func runPrune(ctx context.Context, e env, args []string) error { return errNotBuilt }
