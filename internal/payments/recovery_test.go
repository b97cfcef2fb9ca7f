package payments

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/payments/provider"
)

func opOf(t *testing.T, a answer) uuid.UUID {
	t.Helper()
	s, _ := a.json(t)["operation_id"].(string)
	op, err := uuid.Parse(s)
	if err != nil {
		t.Fatalf("no operation_id in %s", a.body)
	}
	return op
}

func (e *env) payment(op uuid.UUID) Payment {
	e.t.Helper()
	p, err := Get(context.Background(), e.pool, op)
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *env) reservation(op uuid.UUID) string {
	e.t.Helper()
	r, err := ReservationOf(context.Background(), e.pool, op)
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Status
}

// The worker dies after its payment committed and before the provider call
// → recovery takes the expired lease over, inquires, and the provider is
// charged exactly once, even with several recovery workers at once.
func TestCrashBeforeProviderCall(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	var crashes atomic.Int32
	e.svc.afterReserve = func(Payment) error {
		if crashes.Add(1) == 1 {
			return errCrash // the goroutine stops here: nothing else runs
		}
		return nil
	}
	key := newKey()
	body := payBody("inv-crash", 1, "1000")
	if a := e.post(key, body); a.status != 500 {
		t.Fatalf("crashed request: %d %s", a.status, a.body)
	}
	var op uuid.UUID
	if err := e.pool.QueryRow(context.Background(), `SELECT operation_id FROM payment`).Scan(&op); err != nil {
		t.Fatal(err)
	}
	if e.reservation(op) != ReservationActive || len(e.sim.Charges()) != 0 {
		t.Fatal("want an active reservation and no charge after the crash")
	}
	// While the lease lives, the same key is in progress and recovery waits.
	if a := e.post(key, body); a.status != 409 {
		t.Fatalf("retry during the lease: %d %s", a.status, a.body)
	}
	if n, err := e.svc.RecoverOnce(context.Background()); err != nil || n != 0 {
		t.Fatalf("recovery took a live lease: %d %v", n, err)
	}
	e.clk.Advance(31 * time.Second)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.svc.RecoverOnce(context.Background()); err != nil {
				t.Errorf("recover: %v", err)
			}
		}()
	}
	wg.Wait()
	if p := e.payment(op); p.Status != StatusCompleted {
		t.Fatalf("after recovery: %s", p.Status)
	}
	if e.sim.MoneyMoved() != 1 {
		t.Fatalf("money moved %d times, want 1", e.sim.MoneyMoved())
	}
	ch, _ := e.sim.Charge(op)
	if ch.Calls != 1 {
		t.Fatalf("provider got %d charge calls, want 1", ch.Calls)
	}
	a := e.post(key, body)
	if a.status != 201 || !a.replayed || opOf(t, a) != op {
		t.Fatalf("replay after recovery: %d %s", a.status, a.body)
	}
	if debits(e, 1) != 1 {
		t.Fatalf("debits = %d", debits(e, 1))
	}
	e.checkBooks(1)
}

// Recovery after the provider already charged (the owner died after the
// charge, before recording it) → the inquiry finds the charge; no second one.
func TestCrashAfterChargeRecoveryInquires(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	e.svc.afterReserve = func(p Payment) error {
		// The charge happens, then the process dies before recording it.
		_, err := provider.NewClient(e.sim.URL(), 5*time.Second).Charge(context.Background(), provider.ChargeRequest{OperationID: p.OperationID, Amount: p.Amount, Currency: p.Currency})
		if err != nil {
			t.Errorf("charge: %v", err)
		}
		return errCrash
	}
	key := newKey()
	e.post(key, payBody("inv-c2", 1, "300"))
	e.svc.afterReserve = nil
	e.clk.Advance(time.Minute)
	if _, err := e.svc.RecoverOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	var op uuid.UUID
	_ = e.pool.QueryRow(context.Background(), `SELECT operation_id FROM payment`).Scan(&op)
	if p := e.payment(op); p.Status != StatusCompleted || p.ProviderRef == "" {
		t.Fatalf("recovered payment: %+v", p)
	}
	if ch, _ := e.sim.Charge(op); ch.Calls != 1 || e.sim.MoneyMoved() != 1 {
		t.Fatalf("recovery charged again: calls %d moved %d", ch.Calls, e.sim.MoneyMoved())
	}
	e.checkBooks(1)
}

// The worker dies inside its one transaction before the provider call,
// right after taking the key → the transaction rolls back: no record, no
// payment, nothing charged, and the client's retry with the same key runs
// the payment once.
func TestCrashBeforeReserveCommitLeavesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	e.svc.afterOwnership = func(Record) error { return errCrash }
	key := newKey()
	body := payBody("inv-orphan", 1, "100")
	if a := e.post(key, body); a.status != 500 {
		t.Fatalf("crashed: %d", a.status)
	}
	e.svc.afterOwnership = nil
	if n := e.count(`SELECT count(*) FROM idempotency_record`) + e.count(`SELECT count(*) FROM payment`); n != 0 || len(e.sim.Charges()) != 0 {
		t.Fatalf("a rolled-back reserve left %d rows or %d charges", n, len(e.sim.Charges()))
	}
	a := e.post(key, body)
	if a.status != 201 || a.replayed {
		t.Fatalf("retry: %d %s", a.status, a.body)
	}
	if e.sim.MoneyMoved() != 1 || debits(e, 1) != 1 {
		t.Fatal("want one charge")
	}
	e.checkBooks(1)
}

// A key held without a payment (an orphan: what a worker of a version that
// committed the key before the payment left behind when it died) answers
// 409 during its lease; recovery releases it when the lease ends, and the
// client's retry with the same key runs the payment once.
func TestOrphanKeyIsReleased(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	e.keyOf(e.merchant)
	key := newKey()
	body := payBody("inv-orphan", 1, "100")
	if _, err := e.pool.Exec(context.Background(), `
		INSERT INTO idempotency_record (merchant_id, idempotency_key, request_hash, status, operation_id, locked_until, created_at, updated_at, expires_at)
		VALUES ($1, $2, $3, 'processing', $4, $5::timestamptz + interval '30 seconds', $5, $5, $5::timestamptz + interval '72 hours')`,
		e.merchant, key, body.Hash(e.svc.kr.MAC), uuid.Must(uuid.NewV7()), e.clk.Now()); err != nil {
		t.Fatal(err)
	}
	if a := e.post(key, body); a.status != 409 {
		t.Fatalf("retry during the lease: %d", a.status)
	}
	e.clk.Advance(31 * time.Second)
	if n, err := e.svc.RecoverOnce(context.Background()); err != nil || n != 1 {
		t.Fatalf("recovery: %d %v", n, err)
	}
	a := e.post(key, body)
	if a.status != 201 || a.replayed {
		t.Fatalf("retry after release: %d %s", a.status, a.body)
	}
	if e.sim.MoneyMoved() != 1 || debits(e, 1) != 1 {
		t.Fatal("want one charge")
	}
}

// A slow owner whose lease was taken over cannot write after the take-over:
// the lease is its fencing token. It stalls after its reserve commit, past
// its lease; recovery takes the key over and settles the payment; the stale
// owner's charge is answered by the provider's idempotency (no money moves
// twice) and its settlement writes nothing: it answers with the key's
// current result.
func TestStaleOwnerIsFenced(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	release := make(chan struct{})
	reached := make(chan struct{})
	e.svc.afterReserve = func(Payment) error {
		close(reached)
		<-release
		return nil
	}
	key := newKey()
	done := make(chan answer)
	go func() { done <- e.post(key, payBody("inv-slow", 1, "100")) }()
	<-reached
	e.clk.Advance(31 * time.Second)
	if n, err := e.svc.RecoverOnce(context.Background()); err != nil || n != 1 {
		t.Fatalf("recovery: %d %v", n, err)
	}
	var recovered time.Time
	if err := e.pool.QueryRow(context.Background(), `SELECT updated_at FROM payment`).Scan(&recovered); err != nil {
		t.Fatal(err)
	}
	close(release)
	a := <-done
	e.svc.afterReserve = nil
	var updated time.Time
	if err := e.pool.QueryRow(context.Background(), `SELECT updated_at FROM payment`).Scan(&updated); err != nil {
		t.Fatal(err)
	}
	if !updated.Equal(recovered) || debits(e, 1) != 1 || e.sim.MoneyMoved() != 1 {
		t.Fatalf("a fenced owner wrote after the take-over (debits %d, money moved %d)", debits(e, 1), e.sim.MoneyMoved())
	}
	// The stored answer is this request's own operation's, finished by
	// recovery: not a replay of an earlier request's (Idempotent-Replayed).
	if a.status != 201 || a.replayed {
		t.Fatalf("fenced owner answered %d (replayed %v) %s, want the key's stored 201 as its own answer", a.status, a.replayed, a.body)
	}
	e.checkBooks(1)
}

// The provider charges, then the answer times out → unknown: the client sees
// 202 unknown, retries with the key never charge again, the reservation is
// never released while unknown, and reconcile resolves it from an inquiry.
func TestProviderTimeoutUnknownThenReconcile(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{providerTimeout: shortTimeout})
	e.account(1, "5000")
	e.sim.Next(provider.BehaveTimeoutAfterCharge)
	e.sim.SetInquiry(provider.InquiryUnknown)
	key := newKey()
	body := payBody("inv-unk", 1, "1000")
	a := e.post(key, body)
	if a.status != 202 || a.json(t)["status"] != "unknown" {
		t.Fatalf("timeout: %d %s", a.status, a.body)
	}
	op := opOf(t, a)
	for i := 0; i < 5; i++ {
		r := e.post(key, body)
		if r.status != 202 || !r.replayed {
			t.Fatalf("retry %d: %d %s", i, r.status, r.body)
		}
	}
	ch, _ := e.sim.Charge(op)
	if e.sim.MoneyMoved() != 1 || ch.Calls != 1 {
		t.Fatalf("retries reached the provider: calls %d moved %d", ch.Calls, e.sim.MoneyMoved())
	}
	ctx := context.Background()
	if err := e.svc.RefreshGauges(ctx); err != nil {
		t.Fatal(err)
	}
	if got := counterValue(t, e.reg, "sluice_payments_unknown", "", ""); got != 1 {
		t.Fatalf("unknown gauge = %v", got)
	}
	// Inquiries without an answer, recovery passes, time passing: the payment
	// stays unknown and its reservation active.
	for i := 0; i < 4; i++ {
		e.clk.Advance(10 * time.Minute)
		if _, err := e.svc.ReconcileOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := e.svc.RecoverOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			e.sim.SetInquiry(provider.InquiryDown)
		}
		if p := e.payment(op); p.Status != StatusUnknown || e.reservation(op) != ReservationActive {
			t.Fatalf("round %d: %s / reservation %s", i, p.Status, e.reservation(op))
		}
	}
	if got := counterValue(t, e.reg, "sluice_payments_reconcile_age_seconds", "", ""); got < 30*60 {
		t.Fatalf("reconcile age gauge = %v, want ≥ 40 min", got)
	}
	if p := e.payment(op); p.InquiryAttempts != 4 || p.NextInquiryAt == nil || !p.NextInquiryAt.After(e.clk.Now()) {
		t.Fatalf("backoff not recorded: attempts %d next %v", p.InquiryAttempts, p.NextInquiryAt)
	}
	if acc := e.accountState(1); acc.Reserved.String() != "1000" {
		t.Fatalf("reserved %s while unknown", acc.Reserved)
	}
	// Not due yet: nothing is asked.
	e.sim.SetInquiry(provider.InquiryAnswer)
	if n, _ := e.svc.ReconcileOnce(ctx); n != 0 {
		t.Fatalf("inquired before next_inquiry_at")
	}
	e.clk.Advance(time.Hour)
	if n, err := e.svc.ReconcileOnce(ctx); err != nil || n != 1 {
		t.Fatalf("reconcile: %d %v", n, err)
	}
	p := e.payment(op)
	if p.Status != StatusCompleted || p.ResolvedBy != "inquiry" || e.reservation(op) != ReservationFinalized {
		t.Fatalf("after reconcile: %+v", p)
	}
	r := e.post(key, body)
	if r.status != 201 || r.json(t)["status"] != "completed" {
		t.Fatalf("stored answer not updated: %d %s", r.status, r.body)
	}
	if n, _ := e.svc.ReconcileOnce(ctx); n != 0 {
		t.Fatal("resolved twice")
	}
	if e.count(`SELECT count(*) FROM outbox_event WHERE event_type = 'payment.completed.v1'`) != 1 || debits(e, 1) != 1 {
		t.Fatal("want one completed event and one debit")
	}
	if e.sim.MoneyMoved() != 1 {
		t.Fatal("charged twice")
	}
	_ = e.svc.RefreshGauges(ctx)
	if got := counterValue(t, e.reg, "sluice_payments_unknown", "", ""); got != 0 {
		t.Fatalf("unknown gauge = %v after resolution", got)
	}
	e.checkBooks(1)
}

// No definite answer never fails a payment: an inquiry answering not_found
// (a charge still on its way), unknown, or nothing at all keeps it unknown;
// a definite decline then fails it and releases the reservation.
func TestRecoveryAndReconcileNeverGuessFailed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{providerTimeout: shortTimeout, sim: provider.SimConfig{SlowDelay: time.Hour}})
	e.account(1, "5000")
	ctx := context.Background()

	// A: the owner dies after reserving; the provider does not answer the
	// recovery inquiry → unknown, not failed.
	e.svc.afterReserve = func(Payment) error { return errCrash }
	e.post(newKey(), payBody("inv-a", 1, "100"))
	e.svc.afterReserve = nil
	var opA uuid.UUID
	_ = e.pool.QueryRow(ctx, `SELECT operation_id FROM payment WHERE invoice_id = 'inv-a'`).Scan(&opA)
	e.sim.SetInquiry(provider.InquiryDown)
	e.clk.Advance(time.Minute)
	if _, err := e.svc.RecoverOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if p := e.payment(opA); p.Status != StatusUnknown || e.reservation(opA) != ReservationActive {
		t.Fatalf("recovery without an answer: %s / %s", p.Status, e.reservation(opA))
	}
	e.sim.SetInquiry(provider.InquiryAnswer)

	// B: the charge is so slow the client gives up; the provider has not
	// recorded it yet, so inquiries say not_found: still not definite.
	e.sim.Next(provider.BehaveSlow)
	b := e.post(newKey(), payBody("inv-b", 1, "100"))
	if b.status != 202 {
		t.Fatalf("slow: %d %s", b.status, b.body)
	}
	opB := opOf(t, b)
	for i := 0; i < 3; i++ {
		e.clk.Advance(time.Hour)
		if _, err := e.svc.ReconcileOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if p := e.payment(opB); p.Status != StatusUnknown || e.reservation(opB) != ReservationActive {
		t.Fatalf("not_found turned into %s / %s", p.Status, e.reservation(opB))
	}
	rep, err := e.svc.Inquire(ctx, opB)
	if err != nil || rep.Answer != provider.NotFound || rep.Resolved {
		t.Fatalf("inquire action: %+v %v", rep, err)
	}

	// A's charge never reached the provider; now it answers: declined.
	// Charge it through the simulator as declined to give a definite answer.
	e.sim.Next(provider.BehaveDecline)
	if _, err := provider.NewClient(e.sim.URL(), time.Second).Charge(ctx, provider.ChargeRequest{OperationID: opA, Amount: e.payment(opA).Amount, Currency: "TRY"}); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(time.Hour)
	if _, err := e.svc.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if p := e.payment(opA); p.Status != StatusFailed || e.reservation(opA) != ReservationReleased {
		t.Fatalf("definite decline: %s / %s", p.Status, e.reservation(opA))
	}
	if acc := e.accountState(1); acc.Reserved.String() != "100" {
		t.Fatalf("reserved %s: B's reservation must stay", acc.Reserved)
	}
	e.checkBooks(1)
}

// Fifty concurrent resolutions of one unknown payment → one transition.
func TestResolveOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{providerTimeout: shortTimeout})
	e.account(1, "5000")
	e.sim.Next(provider.BehaveTimeoutAfterCharge)
	a := e.post(newKey(), payBody("inv-r", 1, "250"))
	op := opOf(t, a)
	var ok, conflict atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outcome := OutcomeSucceeded
			if i%2 == 1 {
				outcome = OutcomeFailed
			}
			err := db.WithTx(context.Background(), e.pool, func(tx pgx.Tx) error {
				_, err := Resolve(context.Background(), tx, op, outcome, ResolveOptions{ResolvedBy: "operator-test"})
				return err
			})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, ErrNotUnknown):
				conflict.Add(1)
			default:
				t.Errorf("resolve: %v", err)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 1 || conflict.Load() != 49 {
		t.Fatalf("ok %d conflict %d", ok.Load(), conflict.Load())
	}
	if e.count(`SELECT count(*) FROM outbox_event WHERE event_type IN ('payment.completed.v1','payment.failed.v1')`) != 1 {
		t.Fatal("more than one resolution event")
	}
	err := db.WithTx(context.Background(), e.pool, func(tx pgx.Tx) error {
		_, err := Resolve(context.Background(), tx, uuid.New(), OutcomeFailed, ResolveOptions{})
		return err
	})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing payment: %v", err)
	}
	e.checkBooks(1)
}

// payment.* events delivered 10 times each → the inbox absorbs 9 of 10.
func TestEventsDeliveredTenTimes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{providerTimeout: shortTimeout})
	e.account(1, "5000")
	e.post(newKey(), payBody("inv-e1", 1, "10"))
	e.sim.Next(provider.BehaveDecline)
	e.post(newKey(), payBody("inv-e2", 1, "10"))
	e.sim.Next(provider.BehaveTimeoutAfterCharge)
	e.post(newKey(), payBody("inv-e3", 1, "10"))
	e.clk.Advance(time.Hour)
	if _, err := e.svc.ReconcileOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	rows, err := e.pool.Query(context.Background(), `SELECT id::text, event_type, payload::text FROM outbox_event WHERE aggregate_type = 'payment' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type ev struct{ id, typ, payload string }
	var evs []ev
	for rows.Next() {
		var x ev
		if err := rows.Scan(&x.id, &x.typ, &x.payload); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, x)
	}
	rows.Close()
	// requested ×3, completed, failed, unknown, completed (by reconcile)
	if len(evs) != 7 {
		t.Fatalf("events: %d", len(evs))
	}
	for _, x := range evs {
		if !strings.HasPrefix(x.typ, "payment.") || strings.Contains(x.payload, "ayse@") || strings.Contains(x.payload, "Ayşe") {
			t.Fatalf("event %s: %s", x.typ, x.payload)
		}
	}
	in := inbox.New(e.pool)
	effects := map[string]*atomic.Int32{}
	for _, x := range evs {
		effects[x.id] = &atomic.Int32{}
	}
	var dup atomic.Int32
	var wg sync.WaitGroup
	for round := 0; round < 10; round++ {
		for _, x := range evs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := in.Handle(context.Background(), "payments-projection", x.id, func(tx pgx.Tx) error {
					effects[x.id].Add(1)
					return nil
				})
				if err != nil {
					t.Errorf("handle: %v", err)
				}
				if res == inbox.Duplicate {
					dup.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	for id, n := range effects {
		if n.Load() != 1 {
			t.Fatalf("event %s applied %d times, want once", id, n.Load())
		}
	}
	if int(dup.Load()) != 9*len(evs) {
		t.Fatalf("duplicates absorbed = %d, want %d", dup.Load(), 9*len(evs))
	}
	if e.count(`SELECT count(*) FROM inbox_message WHERE consumer = 'payments-projection'`) != len(evs) {
		t.Fatal("inbox rows")
	}
}
