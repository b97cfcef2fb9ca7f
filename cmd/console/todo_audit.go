package main

import "context"

// runAudit is a placeholder until its room is built; replace this file with audit.go.
func runAudit(ctx context.Context, e env, args []string) error { return errNotBuilt }
