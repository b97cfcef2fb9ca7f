package payments

import (
	"context"
	"sync"
	"testing"

	"github.com/sluice-dev/sluice/internal/testkit"
)

// A reservation that finds its account locked is counted as contended and
// its wait observed; the account is never a label.
func TestReservationContentionMeasured(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "1000")
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The lock a concurrent reservation or settlement holds on the account.
	if _, err := tx.Exec(ctx, `UPDATE account SET updated_at = now() WHERE account_id = 1`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var a answer
	wg.Add(1)
	go func() { defer wg.Done(); a = e.post(newKey(), payBody("inv-hot", 1, "10")) }()
	testkit.Until(t, "the payment to wait for the account's lock", func() bool {
		return e.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if a.status != 201 {
		t.Fatalf("contended payment: %d %s", a.status, a.body)
	}
	if got := counterValue(t, e.reg, "sluice_payments_reservations_contended_total", "", ""); got != 1 {
		t.Fatalf("contended reservations = %v, want 1", got)
	}
	if got := counterValue(t, e.reg, "sluice_payments_reservation_lock_wait_seconds", "", ""); got != 1 {
		t.Fatalf("lock waits observed = %v, want 1", got)
	}
	e.checkBooks(1)
}
