package main

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/brokerurl"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
)

// brokerWorker is what the relay and the consumer both start from: a pool
// on a database whose schema this binary ships, the broker, this process's
// metrics registry and, on METRICS_ADDR, its /metrics listener.
type brokerWorker struct {
	log    *slog.Logger
	pool   *pgxpool.Pool
	broker broker.Broker
	reg    *prometheus.Registry
	stop   []func()
}

func openBrokerWorker(ctx context.Context, e env, c config.Common, b config.Broker) (*brokerWorker, error) {
	w := &brokerWorker{log: newLogger(e.stderr, c.LogLevel), reg: newProcessRegistry()}
	pool, err := db.OpenCurrent(ctx, c.DatabaseURL)
	if err != nil {
		return nil, err
	}
	w.pool = pool
	w.stop = append(w.stop, pool.Close)
	w.broker, err = brokerurl.Open(ctx, b.URL, broker.Options{Namespace: b.Namespace, Logger: w.log})
	if err != nil {
		w.Close()
		return nil, err
	}
	w.stop = append(w.stop, func() { _ = w.broker.Close() })
	return w, nil
}

// serveMetrics starts the /metrics listener on addr (none when empty); Close
// stops it. Call it after the worker's collectors are registered.
func (w *brokerWorker) serveMetrics(addr string) error {
	stop, err := startMetricsListener(addr, w.reg, w.log)
	if err != nil {
		return err
	}
	w.stop = append(w.stop, stop)
	return nil
}

// Close stops what the worker started, last first.
func (w *brokerWorker) Close() {
	for i := len(w.stop) - 1; i >= 0; i-- {
		w.stop[i]()
	}
}
