package outbox

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/db"
)

// metrics are the relay's collectors. Several relays in one process (the
// demo runs two) share them: registering an identical collector again reuses
// the one already registered.
type metrics struct {
	published    *prometheus.CounterVec
	failures     prometheus.Counter
	duration     prometheus.Histogram
	leaseExpired prometheus.Counter
	dead         prometheus.Counter
	// unavailable counts the process's relays whose last batch met a
	// broker that could not take any message (Relay.setOutage).
	unavailable prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry() // never the default registry
	}
	m := &metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_outbox_published_total",
			Help: "Outbox events published to the broker and marked published, by topic.",
		}, []string{"topic"}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_outbox_publish_failures_total",
			Help: "Failed publish attempts (each one backs off or dead-letters its event).",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_outbox_publish_duration_seconds",
			Help:    "Time from handing one event to the broker until its ack.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
		leaseExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_outbox_lease_expired_total",
			Help: "Claims that took over an event whose previous lease had expired (a relay died or was too slow).",
		}),
		dead: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_outbox_dead_lettered_total",
			Help: "Events moved to dead after their last allowed attempt failed.",
		}),
		unavailable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_outbox_relays_broker_unavailable",
			Help: "Relays of this process pausing because the broker cannot take any message (unreachable, its stream gone or full): their last batch was given back without spending attempts. 0 when every relay publishes or has nothing to publish.",
		}),
	}
	var err error
	if m.published, err = db.Register(reg, m.published); err != nil {
		return nil, err
	}
	if m.failures, err = db.Register(reg, m.failures); err != nil {
		return nil, err
	}
	if m.duration, err = db.Register(reg, m.duration); err != nil {
		return nil, err
	}
	if m.leaseExpired, err = db.Register(reg, m.leaseExpired); err != nil {
		return nil, err
	}
	if m.dead, err = db.Register(reg, m.dead); err != nil {
		return nil, err
	}
	if m.unavailable, err = db.Register(reg, m.unavailable); err != nil {
		return nil, err
	}
	return m, nil
}
