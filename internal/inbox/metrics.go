package inbox

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	processed, duplicates, stale *prometheus.CounterVec
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
		if err := reg.Register(*c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
			existing, ok := are.ExistingCollector.(*prometheus.CounterVec)
			if !ok {
				return nil, err
			}
			*c = existing
		}
	}
	return m, nil
}
