package paymentsapi_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
	"github.com/sluice-dev/sluice/internal/payments/provider"
)

// BenchmarkCreatePayments measures POST /v1/payments end to end (HTTP, API
// key, idempotency record, payment, reservation, provider call to the
// in-process simulator, settlement) with 8 and 32 concurrent clients, each
// request a new key and invoice, over a pool the size payments-api uses by
// default. It reports payments/s so the two runs show whether throughput
// grows with clients; nothing here asserts a timing.
//
//	go test ./internal/payments/paymentsapi -run '^$' -bench CreatePayments -benchtime 3s
func BenchmarkCreatePayments(b *testing.B) {
	for _, clients := range []int{8, 32} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			benchCreate(b, clients)
		})
	}
}

func benchCreate(b *testing.B, clients int) {
	cfg := dbtest.Config(b)
	cfg.MaxConns = config.DefaultPaymentsPoolSize
	pool, err := db.OpenConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	sim := provider.NewSimulator(provider.SimConfig{})
	if err := sim.Start("127.0.0.1:0"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sim.Close() })
	svc, err := payments.NewService(pool, provider.NewClient(sim.URL(), 5*time.Second), paymentstest.Keyring(b), payments.Config{}, nil, prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	srv := startAPI(b, svc, nil, nil)
	// One account per client, so the run measures the service and not one
	// hot account's row lock.
	accounts := make([]int64, clients)
	for i := range accounts {
		accounts[i] = int64(i + 1)
	}
	apiKey := benchMerchant(b, pool, accounts)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}}
	var next atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				body := payBody(fmt.Sprintf("inv-b-%d", i), accounts[c], "1")
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/payments", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+apiKey)
				req.Header.Set("Idempotency-Key", fmt.Sprintf("bench-%d", i))
				resp, err := hc.Do(req)
				if err != nil || resp.StatusCode != http.StatusCreated {
					failed.Add(1)
				}
				if err == nil {
					resp.Body.Close()
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d of %d payments did not complete", n, b.N)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "payments/s")
}

func benchMerchant(b *testing.B, pool *pgxpool.Pool, accounts []int64) string {
	b.Helper()
	key := paymentstest.Merchant(b, pool, paymentstest.MerchantOpts{ID: "m-bench"})
	for _, id := range accounts {
		paymentstest.Account(b, pool, paymentstest.AccountOpts{ID: id, Merchant: "m-bench", Balance: "1000000000"})
	}
	return key
}
