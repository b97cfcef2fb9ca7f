package payments

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/payments/provider"
)

// lockProbe is a real Provider (the HTTP client to the simulator) that,
// at the moment each call leaves for the provider, checks from a connection
// of its own that the work so far is committed and that nothing holds a
// lock on the operation's rows.
type lockProbe struct {
	provider.Provider
	pool   *pgxpool.Pool
	calls  atomic.Int32
	failed atomic.Pointer[error]
}

func (p *lockProbe) check(op uuid.UUID, call string) {
	p.calls.Add(1)
	err := func() error {
		ctx := context.Background()
		var recStatus, payStatus, resStatus string
		err := p.pool.QueryRow(ctx, `
			SELECT r.status, p.status, b.status
			  FROM idempotency_record r JOIN payment p USING (operation_id) JOIN balance_reservation b USING (operation_id)
			 WHERE r.operation_id = $1`, op).Scan(&recStatus, &payStatus, &resStatus)
		if err != nil {
			return fmt.Errorf("%s: the key, payment and reservation are not committed before the provider call: %w", call, err)
		}
		if recStatus != "processing" || payStatus != "processing" || resStatus != "active" {
			return fmt.Errorf("%s: key %s, payment %s, reservation %s at the provider call", call, recStatus, payStatus, resStatus)
		}
		// NOWAIT fails at once (55P03) on a row someone holds locked.
		return db.WithTx(ctx, p.pool, func(tx pgx.Tx) error {
			for _, q := range []string{
				`SELECT 1 FROM idempotency_record WHERE operation_id = $1 FOR UPDATE NOWAIT`,
				`SELECT 1 FROM payment WHERE operation_id = $1 FOR UPDATE NOWAIT`,
				`SELECT 1 FROM balance_reservation WHERE operation_id = $1 FOR UPDATE NOWAIT`,
				`SELECT 1 FROM account WHERE account_id = (SELECT account_id FROM payment WHERE operation_id = $1) FOR UPDATE NOWAIT`,
			} {
				if _, err := tx.Exec(ctx, q, op); err != nil {
					return fmt.Errorf("%s: a row lock is held across the provider call (%s): %w", call, q, err)
				}
			}
			var open int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`).Scan(&open); err != nil {
				return err
			}
			if open != 0 {
				return fmt.Errorf("%s: %d transactions stay open across the provider call", call, open)
			}
			return nil
		})
	}()
	if err != nil {
		p.failed.CompareAndSwap(nil, &err)
	}
}

func (p *lockProbe) Charge(ctx context.Context, req provider.ChargeRequest) (provider.Result, error) {
	p.check(req.OperationID, "charge")
	return p.Provider.Charge(ctx, req)
}

func (p *lockProbe) Inquire(ctx context.Context, op uuid.UUID) (provider.Result, error) {
	p.check(op, "inquire")
	return p.Provider.Inquire(ctx, op)
}

// Invariant 8: the processing key, the payment and its reservation are
// committed before the provider is called, and no row lock or open
// transaction is held across the call — on the request path and on the
// recovery path alike.
func TestProviderCallHoldsNoLock(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	probe := &lockProbe{Provider: provider.NewClient(e.sim.URL(), 5*time.Second), pool: e.pool}
	svc, err := NewService(e.pool, probe, e.kr, Config{Now: e.clk.Now, Lease: 30 * time.Second}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if res, err := svc.Create(ctx, e.merchant, newKey(), payBody("inv-lock-1", 1, "100")); err != nil || res.Status != 201 {
		t.Fatalf("create: %d %s (%v)", res.Status, res.Body, err)
	}
	// The owner dies after reserving; recovery inquires and charges.
	svc.afterReserve = func(Payment) error { return errCrash }
	if _, err := svc.Create(ctx, e.merchant, newKey(), payBody("inv-lock-2", 1, "100")); !errors.Is(err, errCrash) {
		t.Fatalf("crash: %v", err)
	}
	svc.afterReserve = nil
	e.clk.Advance(time.Minute)
	if n, err := svc.RecoverOnce(ctx); err != nil || n != 1 {
		t.Fatalf("recovery: %d %v", n, err)
	}
	if probe.calls.Load() < 3 {
		t.Fatalf("the probe saw %d provider calls, want the charge, the recovery inquiry and its charge", probe.calls.Load())
	}
	if f := probe.failed.Load(); f != nil {
		t.Fatal(*f)
	}
}
