package main

// Placeholders for subcommands whose rooms are being built; each is replaced
// by its own file (relay.go, consume.go, …). This file must be gone before
// the issues that introduce them are called done.

import (
	"context"
	"errors"
)

var errNotBuilt = errors.New("not built yet")

func runDemo(ctx context.Context, e env, args []string) error        { return errNotBuilt }
func runServe(ctx context.Context, e env, args []string) error       { return errNotBuilt }
func runRelay(ctx context.Context, e env, args []string) error       { return errNotBuilt }
func runConsume(ctx context.Context, e env, args []string) error     { return errNotBuilt }
func runPaymentsAPI(ctx context.Context, e env, args []string) error { return errNotBuilt }
func runPayments(ctx context.Context, e env, args []string) error    { return errNotBuilt }
func runProviderSim(ctx context.Context, e env, args []string) error { return errNotBuilt }
func runPrune(ctx context.Context, e env, args []string) error       { return errNotBuilt }
func runAudit(ctx context.Context, e env, args []string) error       { return errNotBuilt }
