package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/brokerurl"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/telemetry"
)

// brokerWorker is what the relay and the consumer both start from: a pool
// on a database whose schema this binary ships, the broker, this process's
// metrics registry and, on METRICS_ADDR, its /metrics listener.
type brokerWorker struct {
	log    *slog.Logger
	pool   *pgxpool.Pool
	broker broker.Broker
	reg    *prometheus.Registry
	// tracing is the process's tracer provider (a no-op one unless the
	// OTEL_* settings ask for an exporter).
	tracing *telemetry.Tracing
	stop    []func()
}

func openBrokerWorker(ctx context.Context, e env, name string, c config.Common, b config.Broker) (*brokerWorker, error) {
	w := &brokerWorker{log: newLogger(e.stderr, c.LogLevel), reg: newProcessRegistry()}
	tracing, stop, err := startTracing(ctx, c.Telemetry, name, w.log)
	if err != nil {
		return nil, err
	}
	w.tracing = tracing
	w.stop = append(w.stop, stop)
	pool, err := db.OpenCurrent(ctx, c.DatabaseURL)
	if err != nil {
		w.Close()
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

// startTracing builds the process's tracer provider from the OTEL_*
// settings; stop flushes the spans not yet exported.
func startTracing(ctx context.Context, c config.Telemetry, name string, log *slog.Logger) (*telemetry.Tracing, func(), error) {
	t, err := telemetry.Start(ctx, c.Config, "sluice-"+name)
	if err != nil {
		return nil, nil, err
	}
	if c.Enabled() {
		log.Info("tracing on: spans are exported over OTLP/HTTP")
	}
	return t, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := t.Close(sctx); err != nil {
			log.Warn("tracing: flush spans", "err", err)
		}
	}, nil
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
