package payments

import (
	"context"
	"testing"

	"github.com/sluice-dev/sluice/internal/testkit"
)

// Every path reserves in one order: the key, then the invoice, then the
// account. A request that waits for an invoice then holds no account lock,
// so whatever holds the invoice can take the account and finish. Each
// subtest stops a holder of the invoice half way (the invoice held, the
// account not yet taken), sends a new key for the same invoice at it, lets
// the holder take the account, and checks both finish with their answers.
// With the account taken first (the one-statement reserve before this test),
// the two waited for each other and PostgreSQL aborted one of them after
// deadlock_timeout: a 500, seen in CI as 20 keys for one invoice answering
// one 201, 18 422 and one 500 (TestNewKeySameInvoice).
func TestReserveWaitsForTheInvoiceHoldingNoAccount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("a racing attempt in reserve's transaction", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, envOpts{})
		e.account(1, "5000")
		// The racing attempt goes through reserve's transaction (a second
		// service: afterOwnership sends every request of it there) and stops
		// with its payment inserted, before it reserves the balance.
		racer, err := NewService(e.svc.pool, e.svc.prov, e.kr, e.svc.cfg, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		inserted, release := make(chan struct{}), make(chan struct{})
		racer.afterOwnership = func(Record) error { return nil }
		racer.afterPayment = func(Payment) error { close(inserted); <-release; return nil }
		body := payBody("inv-race", 1, "100")
		racerDone := make(chan answer, 1)
		go func() {
			resp, err := racer.Create(ctx, e.merchant, newKey(), body)
			racerDone <- answer{status: resp.Status, body: resp.Body, err: err}
		}()
		select {
		case <-inserted:
		case a := <-racerDone:
			t.Fatalf("the racing attempt ended before its payment was inserted: %d %s %v", a.status, a.body, a.err)
		}

		done := make(chan answer, 1)
		go func() { done <- e.post(newKey(), body) }()
		// The new key waits for the racer's uncommitted invoice.
		testkit.Until(t, "the new key to wait for the racing attempt's invoice", func() bool { return lockWaiters(t, e) == 1 })
		close(release)

		if a := <-racerDone; a.err != nil || a.status != 201 {
			t.Fatalf("the racing attempt: %d %s %v, want 201", a.status, a.body, a.err)
		}
		if a := <-done; a.err != nil || a.status != 422 || a.code(t) != CodeDuplicateInvoice {
			t.Fatalf("the new key: %d %s %v, want 422 %s", a.status, a.body, a.err, CodeDuplicateInvoice)
		}
		if n := e.count(`SELECT count(*) FROM payment`); n != 1 {
			t.Fatalf("%d payments for one invoice, want 1", n)
		}
		e.checkBooks(1)
	})

	t.Run("a settlement moving the live attempt", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, envOpts{})
		e.account(1, "5000")
		body := payBody("inv-settling", 1, "100")
		// The first attempt is reserved and its owner gone: processing,
		// until recovery settles it.
		e.svc.afterReserve = func(Payment) error { return errCrash }
		if a := e.post(newKey(), body); a.status != 500 {
			t.Fatalf("crashed owner: %d %s", a.status, a.body)
		}
		e.svc.afterReserve = nil

		// A settlement in the middle of its transaction, in settle's order:
		// the payment's row moved, the account not yet.
		settling, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = settling.Rollback(ctx) }()
		if _, err := settling.Exec(ctx, `UPDATE payment SET updated_at = updated_at + interval '1 microsecond' WHERE invoice_id = 'inv-settling'`); err != nil {
			t.Fatal(err)
		}

		done := make(chan answer, 1)
		go func() { done <- e.post(newKey(), body) }()
		// The new key waits for the settlement's move of the live attempt.
		testkit.Until(t, "the new key to wait for the settlement", func() bool { return lockWaiters(t, e) == 1 })
		if _, err := settling.Exec(ctx, `UPDATE account SET updated_at = updated_at + interval '1 microsecond' WHERE account_id = 1`); err != nil {
			t.Fatalf("the settlement could not take the account: %v", err)
		}
		if err := settling.Commit(ctx); err != nil {
			t.Fatal(err)
		}

		if a := <-done; a.err != nil || a.status != 422 || a.code(t) != CodeDuplicateInvoice {
			t.Fatalf("the new key: %d %s %v, want 422 %s", a.status, a.body, a.err, CodeDuplicateInvoice)
		}
		if n := e.count(`SELECT count(*) FROM payment`); n != 1 {
			t.Fatalf("%d payments for one invoice, want 1", n)
		}
		e.checkBooks(1)
	})
}

// lockWaiters counts the backends of e's database waiting for a heavyweight
// lock (a row, a transaction, a unique index entry's inserter).
func lockWaiters(t *testing.T, e *env) int {
	t.Helper()
	return e.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)
}
