package payments

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/db"
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

	// Seed 002's measurements: duplicate_ratio (replays ÷ POST requests;
	// the latency per route is paymentsapi's), db_lock_wait and
	// hot_account_rate (contended ÷ all reservations), without an id in any
	// label.
	replays      prometheus.Counter
	reservations prometheus.Counter
	contended    prometheus.Counter
	lockWait     prometheus.Histogram
}

// newMetrics builds the package's collectors and registers them on reg (nil:
// not registered) through db.Register, so two services sharing a registry
// share the collectors. Labels carry bounded values only.
func newMetrics(reg prometheus.Registerer, healthGauges bool) (*metrics, error) {
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
	m.replays = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_idempotency_replays_total",
		Help: "Requests answered with the stored result of their Idempotency-Key (same key, same payload, already final).",
	})
	m.reservations = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_payments_reservations_total",
		Help: "Balance reservations attempted (each takes its account's row lock).",
	})
	m.contended = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_payments_reservations_contended_total",
		Help: "Reservations that found their account's row lock held by another transaction (a hot account).",
	})
	m.lockWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sluice_payments_reservation_lock_wait_seconds",
		Help:    "How long a contended reservation waited for its account's row lock.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	})
	var err error
	register(reg, &m.conflicts, &err)
	if healthGauges {
		register(reg, &m.unknown, &err)
		register(reg, &m.reconcileAge, &err)
		register(reg, &m.discrepancy, &err)
	}
	register(reg, &m.payments, &err)
	register(reg, &m.providerCall, &err)
	register(reg, &m.replays, &err)
	register(reg, &m.reservations, &err)
	register(reg, &m.contended, &err)
	register(reg, &m.lockWait, &err)
	if err != nil {
		return nil, err
	}
	for _, k := range []string{ConflictInProgress, ConflictPayloadMismatch, ConflictBusinessDuplicate} {
		m.conflicts.WithLabelValues(k)
	}
	for _, o := range []string{"completed", "failed", "unknown", "insufficient_funds", "rejected"} {
		m.payments.WithLabelValues(o)
	}
	return m, nil
}

// register replaces *c by the collector db.Register keeps, unless an
// earlier registration failed.
func register[C prometheus.Collector](reg prometheus.Registerer, c *C, err *error) {
	if *err == nil {
		*c, *err = db.Register(reg, *c)
	}
}
