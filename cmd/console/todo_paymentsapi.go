package main

import "context"

// runPaymentsAPI is a placeholder until its room is built; replace this file with paymentsapi.go.
func runPaymentsAPI(ctx context.Context, e env, args []string) error { return errNotBuilt }
