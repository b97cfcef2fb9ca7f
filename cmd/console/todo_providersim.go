package main

import "context"

// runProviderSim is a placeholder until its room is built; replace this file with providersim.go.
func runProviderSim(ctx context.Context, e env, args []string) error { return errNotBuilt }
