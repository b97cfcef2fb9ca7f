package payments

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/payments/provider"
)

// chargeBehindOurBack makes the simulated provider hold a succeeded charge
// for op, as if the "unavailable" answer we acted on had been wrong.
func (e *env) chargeBehindOurBack(op uuid.UUID) {
	e.t.Helper()
	e.sim.Next(provider.BehaveSucceed)
	res, err := provider.NewClient(e.sim.URL(), shortTimeout).Charge(context.Background(), provider.ChargeRequest{OperationID: op, Amount: e.payment(op).Amount, Currency: "TRY"})
	if err != nil || res.Outcome != provider.Succeeded {
		e.t.Fatalf("charge %s at the provider: %+v %v", op, res, err)
	}
}

// failedUnavailable makes a payment failed as provider_unavailable.
func (e *env) failedUnavailable(invoice string) uuid.UUID {
	e.t.Helper()
	e.sim.Next(provider.BehaveDown)
	a := e.post(newKey(), payBody(invoice, 1, "100"))
	if a.status != 502 || a.code(e.t) != CodeProviderUnavailable {
		e.t.Fatalf("%s: %d %s, want 502 provider_unavailable", invoice, a.status, a.body)
	}
	return opOf(e.t, a)
}

// books is what a discrepancy must never touch: the payment's status, its
// reservation, the account and the ledger.
func (e *env) books(op uuid.UUID) string {
	e.t.Helper()
	a := e.accountState(1)
	return fmt.Sprintf("%s %s balance=%s reserved=%s ledger=%d", e.payment(op).Status, e.reservation(op), a.Balance, a.Reserved,
		e.count(`SELECT count(*) FROM ledger_entry`))
}

func (e *env) gauge(name string) float64 {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	e.t.Fatalf("metric %s is not registered", name)
	return 0
}

// An inquiry saying "succeeded" about a payment we recorded failed creates
// exactly one open discrepancy — the console's inquire action, asked
// twice, and a settlement line saying the same add none — and leaves the
// payment's status, reservation and ledger exactly as they were; the read
// queries and the gauge report it.
func TestDiscrepancyFromInquiryAndSettlement(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "1000")
	ctx := context.Background()
	op := e.failedUnavailable("inv-x1")
	e.chargeBehindOurBack(op)
	before := e.books(op)

	for i := range 2 {
		rep, err := e.svc.Inquire(ctx, op)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Answer != provider.Succeeded || rep.Resolved || rep.Status != StatusFailed || rep.Discrepancy != (i == 0) {
			t.Fatalf("inquiry %d: %+v", i, rep)
		}
	}
	lines, _, err := e.settle(op.String()+",succeeded\n", false)
	if err != nil || len(lines) != 1 || lines[0].Result != LineDiscrepancy || !strings.Contains(lines[0].Message, "already open") {
		t.Fatalf("settlement line: %+v %v", lines, err)
	}
	if after := e.books(op); after != before {
		t.Fatalf("a discrepancy changed the books: %s → %s", before, after)
	}
	if n := e.count(`SELECT count(*) FROM payment_discrepancy WHERE operation_id = $1`, op); n != 1 {
		t.Fatalf("%d discrepancy rows, want exactly 1", n)
	}
	n, err := CountOpenDiscrepancies(ctx, e.pool)
	if err != nil || n != 1 {
		t.Fatalf("open discrepancies: %d %v", n, err)
	}
	ds, err := ListOpenDiscrepancies(ctx, e.pool, 10)
	if err != nil || len(ds) != 1 || ds[0].OperationID != op || ds[0].Source != DiscrepancyInquiry || ds[0].ProviderRef == "" || ds[0].ResolvedAt != nil {
		t.Fatalf("list: %+v %v", ds, err)
	}
	if err := e.svc.RefreshGauges(ctx); err != nil {
		t.Fatal(err)
	}
	if g := e.gauge("sluice_payments_discrepancies"); g != 1 {
		t.Fatalf("sluice_payments_discrepancies = %v, want 1", g)
	}
	// An operator's close (after correcting the money outside) ends it;
	// the open count follows and the books stay as they were.
	if _, err := closeIn(e.pool, DiscrepancyClose{ID: ds[0].ID, OperationID: op, ClosedBy: "iss|op", Reason: "charge booked by hand, ticket F-2"}); err != nil {
		t.Fatal(err)
	}
	if n, _ := CountOpenDiscrepancies(ctx, e.pool); n != 0 {
		t.Fatalf("open after resolution: %d", n)
	}
	if after := e.books(op); after != before {
		t.Fatalf("closing changed the books: %s → %s", before, after)
	}
	e.checkBooks(1)
}

// The reconcile worker looks again, a bounded few times, at payments that
// failed as provider_unavailable: one the provider did charge gets a
// discrepancy (and is not flipped); one it did not is checked failedChecks
// times and then left alone; a declined payment is never re-checked.
func TestReconcileRechecksUnavailableFailures(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "1000")
	ctx := context.Background()
	charged := e.failedUnavailable("inv-r1")
	clean := e.failedUnavailable("inv-r2")
	e.sim.Next(provider.BehaveDecline)
	if a := e.post(newKey(), payBody("inv-r3", 1, "100")); a.status != 402 {
		t.Fatalf("decline: %d %s", a.status, a.body)
	}
	if n := e.count(`SELECT count(*) FROM payment WHERE status = 'failed' AND next_inquiry_at IS NOT NULL`); n != 2 {
		t.Fatalf("%d failed payments due for a re-check, want the 2 provider_unavailable ones", n)
	}
	e.chargeBehindOurBack(charged)
	before := e.books(charged)

	// Not due yet: nothing is asked.
	if _, err := e.svc.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := CountOpenDiscrepancies(ctx, e.pool); n != 0 {
		t.Fatalf("re-checked before it was due: %d", n)
	}
	for range failedChecks + 2 {
		e.clk.Advance(time.Hour)
		if _, err := e.svc.ReconcileOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := ListOpenDiscrepancies(ctx, e.pool, 10)
	if err != nil || len(ds) != 1 || ds[0].OperationID != charged || ds[0].Source != DiscrepancyInquiry {
		t.Fatalf("discrepancies %+v %v, want one for the charged payment", ds, err)
	}
	if after := e.books(charged); after != before {
		t.Fatalf("the worker changed the books of a contradicted payment: %s → %s", before, after)
	}
	if p := e.payment(charged); p.NextInquiryAt != nil || p.InquiryAttempts != 1 {
		t.Fatalf("charged: attempts %d, next %v: a definite answer ends the checks", p.InquiryAttempts, p.NextInquiryAt)
	}
	if p := e.payment(clean); p.NextInquiryAt != nil || p.InquiryAttempts != failedChecks || p.Status != StatusFailed {
		t.Fatalf("clean: attempts %d, next %v, want %d checks then none", p.InquiryAttempts, p.NextInquiryAt, failedChecks)
	}
	if g := e.gauge("sluice_payments_discrepancies"); g != 1 {
		t.Fatalf("gauge %v", g)
	}
	e.checkBooks(1)
}
