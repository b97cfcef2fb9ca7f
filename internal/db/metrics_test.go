package db_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluice-dev/sluice/internal/db"
)

func TestRegisterSharesEqualCollectorsAndRefusesConflicts(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	newVec := func() *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_test_total", Help: "h"}, []string{"topic"})
	}
	first, err := db.Register(reg, newVec())
	if err != nil {
		t.Fatal(err)
	}
	second, err := db.Register(reg, newVec())
	if err != nil {
		t.Fatalf("an equal collector registered twice: %v", err)
	}
	if first != second {
		t.Fatal("the second registration must return the collector already registered, so both parts count in one series")
	}
	second.WithLabelValues("a").Inc()
	if got := testCount(t, reg); got != 1 {
		t.Fatalf("counted %v through the shared collector, want 1", got)
	}
	// Same name, other labels: an error, never a panic.
	other := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_test_total", Help: "h"}, []string{"other"})
	if _, err := db.Register(reg, other); err == nil {
		t.Fatal("a conflicting registration must be an error")
	}
	if err := db.RegisterAll(reg, collectors.NewGoCollector(), collectors.NewGoCollector()); err != nil {
		t.Fatalf("the Go collector registered twice: %v", err)
	}
	if _, err := db.Register(nil, newVec()); err != nil {
		t.Fatalf("a nil registry: %v", err)
	}
}

func testCount(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "sluice_test_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("sluice_test_total not gathered")
	return 0
}
