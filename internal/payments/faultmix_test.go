package payments

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/payments/provider"
	"github.com/sluice-dev/sluice/internal/pii"
)

// Issue 7 under a random fault mix: the real simulated provider charges
// and then drops the connection unanswered half of the time (after 300 ms,
// well within the client's patience, on keep-alive connections the service
// reuses), answers 503 "unavailable" to a third of the requests (repeats
// included), and several clients send each payment at once and retry with
// the same key. Afterwards no payment is failed that the provider charged,
// none is completed that it did not, no discrepancy was needed, and the
// books add up.
func TestFaultMixNeverFailsACharge(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	sim := provider.NewSimulator(provider.SimConfig{TimeoutAfterChargeRate: 0.5, DownRate: 0.3, HangFor: 300 * time.Millisecond, Seed: 7})
	if err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	keys, blind, _ := pii.GenerateSpec("f1")
	kr, _ := pii.ParseKeyring(keys, blind)
	reg := prometheus.NewRegistry()
	svc, err := NewService(pool, provider.NewClient(sim.URL(), 5*time.Second), kr, Config{
		Lease: 10 * time.Second, RecoveryInterval: 100 * time.Millisecond, ReconcileInterval: 100 * time.Millisecond,
		InquiryBackoff: 50 * time.Millisecond, InquiryBackoffMax: 200 * time.Millisecond,
	}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	wctx, stopWorkers := context.WithCancel(ctx)
	workersDone := make(chan struct{})
	go func() { defer close(workersDone); _ = svc.RunWorkers(wctx) }()

	e := &env{t: t, pool: pool, svc: svc, reg: reg, merchant: "m-1", keys: map[string]string{}}
	e.account(1, "100000")
	const payments, clients = 30, 3
	var wg sync.WaitGroup
	for i := range payments {
		key, body := newKey(), payBody(fmt.Sprintf("inv-mix-%d", i), 1, "10")
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// A client retries with the same key until the answer is
				// final (or unknown, which it must not pay again for).
				for try := 0; try < 50; try++ {
					a := e.post(key, body)
					if a.status != 409 && a.status != 0 {
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
		}
	}
	wg.Wait()
	stopWorkers()
	<-workersDone

	charged := map[uuid.UUID]bool{}
	for _, c := range sim.Charges() {
		charged[c.OperationID] = c.Status == provider.Succeeded
	}
	rows, err := pool.Query(ctx, `SELECT p.operation_id, p.status, coalesce(p.failure_code, ''),
		(SELECT count(*) FROM ledger_entry l WHERE l.operation_id = p.operation_id AND l.entry_type = 'debit') FROM payment p`)
	if err != nil {
		t.Fatal(err)
	}
	byStatus := map[string]int{}
	for rows.Next() {
		var op uuid.UUID
		var status, code string
		var debits int
		if err := rows.Scan(&op, &status, &code, &debits); err != nil {
			t.Fatal(err)
		}
		byStatus[status+" "+code]++
		switch Status(status) {
		case StatusFailed:
			if charged[op] || debits != 0 {
				t.Errorf("payment %s is failed (%s) but the provider charged it=%v (debits %d)", op, code, charged[op], debits)
			}
		case StatusCompleted:
			if !charged[op] || debits != 1 {
				t.Errorf("payment %s is completed but the provider charged it=%v (debits %d)", op, charged[op], debits)
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("payments by status: %v; provider charges %d, money moved %d", byStatus, len(charged), sim.MoneyMoved())
	if n := e.count(`SELECT count(*) FROM payment`); n != payments {
		t.Fatalf("%d payments, want %d", n, payments)
	}
	// The mix must really have produced both faults, or the test proves
	// nothing.
	if byStatus["failed "+CodeProviderUnavailable] == 0 || e.count(`SELECT count(*) FROM payment WHERE unknown_since IS NOT NULL`) == 0 {
		t.Fatalf("the fault mix produced no provider_unavailable failure or no unknown: %v", byStatus)
	}
	if n, err := CountOpenDiscrepancies(ctx, pool); err != nil || n != 0 {
		t.Fatalf("open discrepancies %d (%v): a charged payment was recorded failed", n, err)
	}
	e.checkBooks(1)
}
