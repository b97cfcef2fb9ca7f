package payments

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Conflict kinds of sluice_idempotency_conflicts_total.
const (
	ConflictInProgress        = "in_progress"
	ConflictPayloadMismatch   = "payload_mismatch"
	ConflictBusinessDuplicate = "business_duplicate"
)

type metrics struct {
	conflicts    *prometheus.CounterVec
	unknown      prometheus.Gauge
	reconcileAge prometheus.Gauge
	discrepancy  prometheus.Gauge
	payments     *prometheus.CounterVec
	providerCall *prometheus.HistogramVec
}

// newMetrics builds the package's collectors and registers them on reg (nil:
// not registered). Labels carry bounded values only.
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_idempotency_conflicts_total",
			Help: "Requests refused by idempotency or business uniqueness, by kind (in_progress, payload_mismatch, business_duplicate).",
		}, []string{"kind"}),
		unknown: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_payments_unknown",
			Help: "Payments whose provider outcome is unknown (money may have moved).",
		}),
		reconcileAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_payments_reconcile_age_seconds",
			Help: "Age of the oldest unknown payment (0 when there is none).",
		}),
		discrepancy: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_payments_discrepancies",
			Help: "Open discrepancies: final payments the provider's evidence contradicts (e.g. failed here, charged there), waiting for an operator.",
		}),
		payments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_payments_total",
			Help: "Payment outcomes recorded, by outcome (completed, failed, unknown, insufficient_funds, rejected).",
		}, []string{"outcome"}),
		providerCall: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_provider_call_duration_seconds",
			Help:    "Provider call latency, by operation (charge, inquire).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"op"}),
	}
	for _, k := range []string{ConflictInProgress, ConflictPayloadMismatch, ConflictBusinessDuplicate} {
		m.conflicts.WithLabelValues(k)
	}
	for _, o := range []string{"completed", "failed", "unknown", "insufficient_funds", "rejected"} {
		m.payments.WithLabelValues(o)
	}
	if reg != nil {
		reg.MustRegister(m.conflicts, m.unknown, m.reconcileAge, m.discrepancy, m.payments, m.providerCall)
	}
	return m
}
