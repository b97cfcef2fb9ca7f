package db

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c with reg and returns the collector to use from now
// on: c itself, or the equal collector already registered. One process may
// run several parts that share a registry (the demo runs relays, the
// consumer, payments and the console together, and two relays register the
// same metrics), so "already registered" is not an error; a conflicting
// registration (same name, other labels or type) is, and nothing panics.
// A nil reg registers nothing and returns c.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if reg == nil {
		return c, nil
	}
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("register metrics: %w", err)
}

// RegisterAll registers collectors whose existing twin need not be kept
// (process and Go runtime collectors, custom collectors that read shared
// state), with Register's rules.
func RegisterAll(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if _, err := Register(reg, c); err != nil {
			return err
		}
	}
	return nil
}
