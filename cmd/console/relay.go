package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/outbox"
)

func runRelay(ctx context.Context, e env, args []string) error {
	var c config.Relay
	if _, err := configure(e, "relay", "Outbox relay worker: claims pending events (FOR UPDATE SKIP LOCKED, under a lease),\npublishes them to the broker, marks them published. Run as many as you like, on as many hosts as you like.\nStops cleanly on SIGINT/SIGTERM.", &c, args, nil); err != nil {
		return err
	}
	w, err := openBrokerWorker(ctx, e, "relay", c.Common, c.Broker)
	if err != nil {
		return err
	}
	defer w.Close()
	relay, err := outbox.NewRelay(w.pool, w.broker, outbox.RelayConfig{
		BatchSize:          c.BatchSize,
		Lease:              c.Lease,
		PollInterval:       c.PollInterval,
		MaxAttempts:        c.MaxAttempts,
		Backoff:            outbox.Backoff{Base: c.BackoffBase, Cap: c.BackoffCap},
		DisableOrdering:    !c.Ordering,
		PublishConcurrency: c.PublishConcurrency,
		Tracing:            w.tracing.Provider(),
		Shards:             c.Shards,
	}, w.log, w.reg)
	if err != nil {
		return err
	}
	if err := w.serveMetrics(c.MetricsAddr); err != nil {
		return err
	}
	warnIfRelaysDisagree(ctx, w, c.Shards, c.Ordering)
	return relay.Run(ctx)
}

// warnIfRelaysDisagree says at start when the relays already running publish
// otherwise than this one will (the console flags it too, once this relay
// reports): consumers read one shard count and see nothing of the others.
func warnIfRelaysDisagree(ctx context.Context, w *brokerWorker, shards int, ordered bool) {
	running, err := outbox.ReadRelays(ctx, w.pool)
	if err != nil || running.Alive() == 0 {
		return // the relay's own report will say more; nothing to compare with
	}
	if !slices.Contains(running.Shards, shards) || !slices.Contains(running.Ordered, ordered) {
		w.log.Warn("relay: the running relays publish differently; consumers will miss or reorder events: give every relay and consumer the same OUTBOX_SHARDS and RELAY_ORDERING",
			"outbox_shards", shards, "running_relays_outbox_shards", running.Shards,
			"relay_ordering", ordered, "running_relays_ordering", running.Ordered)
	}
}

// newProcessRegistry is a registry of this process's own (never the
// default registry), with the Go runtime and process collectors.
func newProcessRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// startMetricsListener serves /metrics on addr (nothing when addr is empty)
// for the worker subcommands, which have no web server of their own.
func startMetricsListener(addr string, reg *prometheus.Registry, log *slog.Logger) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("METRICS_ADDR: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics listener stopped", "err", err)
		}
	}()
	log.Info("serving metrics", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
