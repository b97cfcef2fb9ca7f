package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/payments/paymentsapi"
	"github.com/sluice-dev/sluice/internal/payments/provider"
	"github.com/sluice-dev/sluice/internal/telemetry"
)

func runPaymentsAPI(ctx context.Context, e env, args []string) error {
	var c config.PaymentsAPI
	if _, err := configure(e, "payments-api", "The reference payments service: POST /v1/payments (Authorization: Bearer <merchant API key>, Idempotency-Key),\nGET /v1/payments/{operation_id}, /metrics, and the recovery, reconcile and expiry workers.\nMerchants and their keys: `console merchants --help`. Answer codes: docs/payments-api.md.", &c, args, nil); err != nil {
		return err
	}
	kr := c.Keyring // parsed and checked by Validate
	log := newLogger(e.stderr, c.LogLevel)
	tracing, stopTracing, err := startTracing(ctx, c.Telemetry, "payments-api", log)
	if err != nil {
		return err
	}
	defer stopTracing()
	pcfg, err := pgxpool.ParseConfig(c.DatabaseURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	if c.Telemetry.Enabled() {
		// A span per statement inside a traced request (none otherwise).
		pcfg.ConnConfig.Tracer = telemetry.NewQueryTracer(tracing.Provider())
	}
	// pgx's default (4, or the number of CPUs if more) queues requests
	// behind a handful of connections; each request in flight holds one for
	// a few short statements, so the pool is sized for the concurrency.
	pcfg.MaxConns = int32(c.PoolSize)
	pool, err := db.OpenConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := db.CheckSchema(ctx, pool); err != nil {
		return err
	}
	reg := newProcessRegistry()
	// Wakes the relays after each commit that wrote a payment.* event, so
	// they publish it at once instead of on their next poll.
	notifier := outbox.NewNotifier(pool, 0, log)
	svc, err := payments.NewService(pool, provider.NewClient(c.ProviderURL, c.ProviderTimeout), kr, payments.Config{
		Topic: c.Topic, Lease: c.Lease, RetryWindow: c.RetryWindow,
		RecoveryInterval: c.RecoveryInterval, ReconcileInterval: c.ReconcileInterval,
		InquiryBackoff: c.InquiryBackoff, InquiryBackoffMax: c.InquiryBackoffMax, ExpiryInterval: c.ExpiryInterval,
		Poker: notifier,
	}, log, reg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return fmt.Errorf("PAYMENTS_API_ADDR: listen %s: %w", c.Addr, err)
	}
	api, err := paymentsapi.New(svc, paymentsapi.Config{AllowedHosts: paymentsapi.AllowedHosts(ln.Addr().String(), c.HostList()), Logger: log, Registerer: reg,
		Tracing: tracing.Provider()})
	if err != nil {
		ln.Close()
		return err
	}
	mux := http.NewServeMux()
	if c.MetricsAddr == "" {
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	} else {
		stop, err := startMetricsListener(c.MetricsAddr, reg, log)
		if err != nil {
			ln.Close()
			return err
		}
		defer stop()
	}
	mux.Handle("/", api)
	srv := paymentsapi.NewServer(mux)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	wctx, stopWorkers := context.WithCancel(ctx)
	workersDone := make(chan struct{})
	notifierDone := make(chan struct{})
	go func() {
		defer close(workersDone)
		_ = svc.RunWorkers(wctx)
	}()
	go func() {
		defer close(notifierDone)
		_ = notifier.Run(wctx)
	}()
	log.Info("payments-api listening", "addr", ln.Addr().String(), "provider", c.ProviderURL, "db_pool_size", c.PoolSize)
	select {
	case <-ctx.Done():
	case err = <-serveErr:
	}
	stopWorkers()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-workersDone
	<-notifierDone
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
