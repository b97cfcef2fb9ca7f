package payments

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/payments/provider"
)

// Two payments processes race on the same records: each runs its recovery
// and reconcile workers at once, an operator's inquire action and the
// end-of-day settlement file join in. Whoever wins, every payment ends in
// the state the provider's own record says, the provider is asked to charge
// each operation once (never a blind second charge), and each payment has
// one final transition: one ledger debit when completed and none when
// failed, one final event, its reservation finalized or released once, and
// the account's books add up.
func TestConcurrentRecoveryAndReconcileWorkers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{providerTimeout: shortTimeout, sim: provider.SimConfig{HangFor: time.Minute}})
	e.account(1, "100000")
	ctx := context.Background()
	other, err := NewService(e.pool, provider.NewClient(e.sim.URL(), shortTimeout), e.kr, Config{Now: e.clk.Now, Lease: 30 * time.Second}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	services := []*Service{e.svc, other}

	// Crashed owners: payments reserved, the provider never called.
	e.svc.afterReserve = func(Payment) error { return errCrash }
	const crashed = 12
	for i := range crashed {
		if a := e.post(newKey(), payBody(fmt.Sprintf("inv-crash-%d", i), 1, "10")); a.status != 500 {
			t.Fatalf("crash %d: %d %s", i, a.status, a.body)
		}
	}
	e.svc.afterReserve = nil
	// Unknown payments: the provider charged, then the answer was lost.
	var unknown []uuid.UUID
	for i := range 4 {
		e.sim.Next(provider.BehaveTimeoutAfterCharge)
		a := e.post(newKey(), payBody(fmt.Sprintf("inv-unknown-%d", i), 1, "10"))
		if a.status != 202 {
			t.Fatalf("unknown %d: %d %s", i, a.status, a.body)
		}
		unknown = append(unknown, opOf(t, a))
	}
	// What recovery's charges will meet, a third each.
	for i := range crashed {
		e.sim.Next([]provider.Behaviour{provider.BehaveSucceed, provider.BehaveDecline, provider.BehaveTimeoutAfterCharge}[i%3])
	}
	var settlement strings.Builder
	for _, op := range unknown {
		fmt.Fprintf(&settlement, "%s,succeeded\n", op)
	}

	for round := 0; round < 4; round++ {
		e.clk.Advance(time.Hour) // every lease expired, every inquiry due
		var wg sync.WaitGroup
		do := func(name string, f func() error) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := f(); err != nil {
					t.Errorf("round %d, %s: %v", round, name, err)
				}
			}()
		}
		for i, s := range services {
			for range 2 {
				do(fmt.Sprintf("recovery %d", i), func() error { _, err := s.RecoverOnce(ctx); return err })
				do(fmt.Sprintf("reconcile %d", i), func() error { _, err := s.ReconcileOnce(ctx); return err })
			}
		}
		for _, op := range unknown {
			do("inquire", func() error { _, err := other.Inquire(ctx, op); return err })
		}
		do("settlement", func() error {
			_, err := ApplySettlement(ctx, e.pool, strings.NewReader(settlement.String()), SettlementOptions{Source: "eod.csv", Now: e.clk.Now})
			return err
		})
		wg.Wait()
	}

	rows, err := e.pool.Query(ctx, `SELECT operation_id FROM payment ORDER BY operation_id`)
	if err != nil {
		t.Fatal(err)
	}
	var ops []uuid.UUID
	for rows.Next() {
		var op uuid.UUID
		if err := rows.Scan(&op); err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
	}
	rows.Close()
	if len(ops) != crashed+len(unknown) {
		t.Fatalf("%d payments, want %d", len(ops), crashed+len(unknown))
	}
	completed := 0
	for _, op := range ops {
		p := e.payment(op)
		ch, charged := e.sim.Charge(op)
		if !charged || ch.Calls != 1 {
			t.Errorf("payment %s: charged %v with %d charge calls, want exactly one call", op, charged, ch.Calls)
			continue
		}
		want, wantRes, wantDebits, final := StatusCompleted, ReservationFinalized, 1, EventCompleted
		if ch.Status == provider.Declined {
			want, wantRes, wantDebits, final = StatusFailed, ReservationReleased, 0, EventFailed
		} else {
			completed++
		}
		if p.Status != want {
			t.Errorf("payment %s is %s, the provider says %s", op, p.Status, ch.Status)
		}
		if r := e.reservation(op); r != wantRes {
			t.Errorf("payment %s (%s): reservation %s, want %s", op, p.Status, r, wantRes)
		}
		if n := e.count(`SELECT count(*) FROM ledger_entry WHERE operation_id = $1 AND entry_type = 'debit'`, op); n != wantDebits {
			t.Errorf("payment %s (%s): %d debits, want %d", op, p.Status, n, wantDebits)
		}
		if n := e.count(`SELECT count(*) FROM outbox_event WHERE aggregate_id = $1 AND event_type IN ($2, $3)`, op.String(), EventCompleted, EventFailed); n != 1 {
			t.Errorf("payment %s: %d final events, want one (%s)", op, n, final)
		}
		if n := e.count(`SELECT count(*) FROM outbox_event WHERE aggregate_id = $1 AND event_type = $2`, op.String(), EventUnknown); n > 1 {
			t.Errorf("payment %s: %d unknown events, want at most one", op, n)
		}
		if rec, err := RecordByOperation(ctx, e.pool, op); err != nil || rec.Status != want || rec.LockedUntil != nil {
			t.Errorf("payment %s: key %+v (%v), want %s without a lease", op, rec, err, want)
		}
	}
	if e.sim.MoneyMoved() != completed {
		t.Errorf("money moved %d times for %d completed payments", e.sim.MoneyMoved(), completed)
	}
	if completed == 0 || completed == len(ops) {
		t.Fatalf("%d of %d completed: the mix did not exercise both outcomes", completed, len(ops))
	}
	e.checkBooks(1)
}
