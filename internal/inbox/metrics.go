package inbox

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/db"
)

type metrics struct {
	processed, duplicates, stale *prometheus.CounterVec
	// shardsHeld is how many shards this process's sharded consumers read
	// now, by consumer: where the shards went after a rebalance, per process.
	shardsHeld *prometheus.GaugeVec
}

// newMetrics builds the inbox collectors on reg (nil: a private registry).
// Consumer names are configuration, never message data, so the label stays
// bounded.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &metrics{
		processed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_inbox_processed_total", Help: "Messages whose effect was applied, by consumer.",
		}, []string{"consumer"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_inbox_duplicates_total", Help: "Redelivered messages absorbed by the inbox, by consumer.",
		}, []string{"consumer"}),
		stale: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_inbox_stale_total", Help: "Messages dropped as older than their aggregate's applied sequence, by consumer.",
		}, []string{"consumer"}),
	}
	for _, c := range []**prometheus.CounterVec{&m.processed, &m.duplicates, &m.stale} {
		var err error
		if *c, err = db.Register(reg, *c); err != nil {
			return nil, err
		}
	}
	var err error
	if m.shardsHeld, err = db.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_inbox_shards_held",
		Help: "Shards this process's sharded consumer reads now, by consumer (they share the shards with the consumer's other processes).",
	}, []string{"consumer"})); err != nil {
		return nil, err
	}
	return m, nil
}
