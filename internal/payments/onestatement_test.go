package payments

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/payments/provider"
)

// The common path reserves and settles in one statement each (bench P1):
// this fails if it stops being taken (everything falling back to the
// transactions would still pass every other test), if it writes part of a
// payment, or if its events differ from what the transaction path writes.
func TestReserveAndSettleInOneStatementEach(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	ctx := context.Background()
	req := payBody("inv-one", 1, "1000")
	sealedFor := func(op uuid.UUID) sealedCustomer {
		c, err := e.svc.sealCustomer(op, req.Customer)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	rec := Record{MerchantID: e.merchant, Key: newKey(), RequestHash: req.Hash(e.kr.MAC), Status: StatusProcessing, OperationID: uuid.Must(uuid.NewV7())}

	p, lease, done, err := e.svc.reserveOne(ctx, rec, req, sealedFor(rec.OperationID))
	if err != nil || !done {
		t.Fatalf("reserveOne on a covering, unlocked account: done=%v err=%v", done, err)
	}
	if p.Status != StatusProcessing || p.Attempt != 1 || p.OperationID != rec.OperationID || lease.IsZero() {
		t.Fatalf("reserved payment %+v lease %v", p, lease)
	}
	if acc := e.accountState(1); acc.Reserved.String() != "1000" {
		t.Fatalf("reserved %s, want 1000", acc.Reserved)
	}
	var payload []byte
	if err := e.pool.QueryRow(ctx, `SELECT payload FROM outbox_event WHERE event_type = $1`, EventRequested).Scan(&payload); err != nil {
		t.Fatal(err)
	}
	var ev eventPayload
	if err := json.Unmarshal(payload, &ev); err != nil {
		t.Fatalf("requested event %s: %v", payload, err)
	}
	if ev.Attempt != 1 || !ev.OccurredAt.Equal(p.CreatedAt) || ev.Status != StatusProcessing {
		t.Fatalf("requested event %s: want attempt 1 at %v", payload, p.CreatedAt)
	}

	// The same key again: nothing more is written, the key answers.
	again := rec
	again.OperationID = uuid.Must(uuid.NewV7())
	if _, _, _, err := e.svc.reserveOne(ctx, again, req, sealedFor(again.OperationID)); !errors.Is(err, errKeyTaken) {
		t.Fatalf("same key: err %v, want errKeyTaken", err)
	}
	// More than the account covers: nothing written, the transaction decides.
	big := rec
	big.Key, big.OperationID = newKey(), uuid.Must(uuid.NewV7())
	if _, _, done, err := e.svc.reserveOne(ctx, big, payBody("inv-big", 1, "4500"), sealedFor(big.OperationID)); done || err != nil {
		t.Fatalf("uncovered amount: done=%v err=%v, want neither", done, err)
	}
	if n := e.count(`SELECT count(*) FROM payment`) + e.count(`SELECT count(*) FROM idempotency_record`); n != 2 {
		t.Fatalf("payments + keys = %d after the refused statements, want 2", n)
	}

	stored, err := e.svc.settleOne(ctx, p, StatusCompleted, details{providerRef: "ref-1"}, lease, callRecord{kind: "charge", end: time.Now(), res: provider.Result{Outcome: provider.Succeeded, ProviderRef: "ref-1"}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := GetRecord(ctx, e.pool, e.merchant, rec.Key)
	if err != nil {
		t.Fatal(err)
	}
	if stored.ResponseStatus != 201 || got.Status != StatusCompleted || string(got.ResponseBody) != string(stored.ResponseBody) || got.LockedUntil != nil {
		t.Fatalf("settled answer %d %s; stored %+v", stored.ResponseStatus, stored.ResponseBody, got)
	}
	if acc := e.accountState(1); acc.Balance.String() != "4000" || !acc.Reserved.IsZero() {
		t.Fatalf("account after settling: %+v", acc)
	}
	e.checkBooks(1)
	if n := e.count(`SELECT count(*) FROM payment_provider_call WHERE operation_id = $1`, p.OperationID); n != 1 {
		t.Fatalf("provider calls recorded: %d, want 1", n)
	}
	// A stale owner (its lease gone) writes nothing.
	if _, err := e.svc.settleOne(ctx, p, StatusFailed, details{}, lease, callRecord{kind: "charge", end: time.Now()}); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("settling again: %v, want ErrLeaseLost", err)
	}
	if n := e.count(`SELECT count(*) FROM outbox_event WHERE aggregate_id = $1`, p.OperationID.String()); n != 2 {
		t.Fatalf("events of the payment: %d, want requested + completed", n)
	}
}

// sluice_assert is what keeps the one-statement paths all-or-nothing.
func TestStatementAssertRollsBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	_, err := e.pool.Exec(context.Background(), `
		WITH u AS (UPDATE account SET reserved = reserved + 1 WHERE account_id = 1 RETURNING 1)
		SELECT sluice_assert(NOT EXISTS (SELECT 1 FROM u), 'test')`)
	if db.Code(err) != codeStatementRefused {
		t.Fatalf("err %v, want SQLSTATE SL001", err)
	}
	if acc := e.accountState(1); !acc.Reserved.IsZero() {
		t.Fatalf("the refused statement's write committed: %+v", acc)
	}
}
