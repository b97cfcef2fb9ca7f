package main

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/payments/provider"
)

func runProviderSim(ctx context.Context, e env, args []string) error {
	var c config.ProviderSim
	if _, err := configure(e, "provider-sim", "The simulated payment provider: its own HTTP server with its own record of charges (idempotent by operation id)\nand a fault mix. API: POST /v1/charges, GET /v1/charges/{operation_id}; admin: GET /charges,\nPOST /admin/next {\"behaviours\":[\"decline\"|\"timeout_after_charge\"|\"slow\"|\"down\"|\"succeed\"]},\nPOST /admin/inquiry {\"mode\":\"answer\"|\"unknown\"|\"down\",\"operation_id\":optional}.", &c, args, nil); err != nil {
		return err
	}
	log := newLogger(e.stderr, c.LogLevel)
	sim := provider.NewSimulator(provider.SimConfig{
		DeclineRate: c.DeclineRate, SlowRate: c.SlowRate, TimeoutAfterChargeRate: c.TimeoutAfterChargeRate, DownRate: c.DownRate,
		InquiryUnknownRate: c.InquiryUnknownRate, InquiryStuckRate: c.InquiryStuckRate,
		SlowDelay: c.SlowDelay, HangFor: c.HangFor, Logger: log,
	})
	if err := sim.Start(c.Addr); err != nil {
		return fmt.Errorf("PROVIDER_SIM_ADDR: %w", err)
	}
	log.Info("provider-sim listening", "url", sim.URL())
	<-ctx.Done()
	return sim.Close()
}
