package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/payments/provider"
	"github.com/sluice-dev/sluice/internal/pii"
)

func runPaymentsAPI(ctx context.Context, e env, args []string) error {
	var c config.PaymentsAPI
	f := config.NewFlags("payments-api", "The reference payments service: POST /v1/payments (Idempotency-Key, X-Merchant-ID), GET /v1/payments/{operation_id},\n/metrics, and the recovery, reconcile and expiry workers.", e.lookup, e.stderr)
	c.Register(f)
	if err := f.Parse(args); err != nil {
		return err
	}
	if err := c.Validate(); err != nil {
		return err
	}
	kr, err := pii.ParseKeyring(c.PIIKeys, c.PIIBlindIndexKey)
	if err != nil {
		return err
	}
	log := newLogger(e.stderr, c.LogLevel)
	pool, err := db.OpenCurrent(ctx, c.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	svc, err := payments.NewService(pool, provider.NewClient(c.ProviderURL, c.ProviderTimeout), kr, payments.Config{
		Topic: c.Topic, Lease: c.Lease, RetryWindow: c.RetryWindow,
		RecoveryInterval: c.RecoveryInterval, ReconcileInterval: c.ReconcileInterval,
		InquiryBackoff: c.InquiryBackoff, InquiryBackoffMax: c.InquiryBackoffMax, ExpiryInterval: c.ExpiryInterval,
	}, log, reg)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/", svc.Handler())
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return fmt.Errorf("PAYMENTS_API_ADDR: listen %s: %w", c.Addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	wctx, stopWorkers := context.WithCancel(ctx)
	workersDone := make(chan struct{})
	go func() {
		defer close(workersDone)
		_ = svc.RunWorkers(wctx)
	}()
	log.Info("payments-api listening", "addr", ln.Addr().String(), "provider", c.ProviderURL)
	select {
	case <-ctx.Done():
	case err = <-serveErr:
	}
	stopWorkers()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-workersDone
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
