package web_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
	"github.com/sluice-dev/sluice/internal/payments/provider"
	"github.com/sluice-dev/sluice/internal/testkit"
	"github.com/sluice-dev/sluice/web"
)

var accountSeq atomic.Int64

// unknownPayment plants an unknown payment of amount on a fresh account.
func (h *harness) unknownPayment(t *testing.T, o paymentstest.PaymentOpts) (uuid.UUID, int64) {
	t.Helper()
	acc := paymentstest.Account(t, h.pool, paymentstest.AccountOpts{ID: 9_000_000 + accountSeq.Add(1), Balance: "100000.00"})
	o.Account = acc
	return paymentstest.Payment(t, h.pool, o), acc
}

type effects struct {
	status, reservation          string
	ledger, completed, failed    int
	okAudit, conflicts, requests int
}

func (h *harness) effectsOf(t *testing.T, op uuid.UUID) effects {
	t.Helper()
	var e effects
	ctx := context.Background()
	err := h.pool.QueryRow(ctx, `
		SELECT p.status, r.status,
		       (SELECT count(*) FROM ledger_entry WHERE operation_id = p.operation_id),
		       (SELECT count(*) FROM outbox_event WHERE aggregate_type = 'payment' AND aggregate_id = p.operation_id::text AND event_type = 'payment.completed.v1'),
		       (SELECT count(*) FROM outbox_event WHERE aggregate_type = 'payment' AND aggregate_id = p.operation_id::text AND event_type = 'payment.failed.v1'),
		       (SELECT count(*) FROM audit_event WHERE target_type = 'payment' AND target_id = p.operation_id::text AND outcome = 'ok' AND action IN ('payments.resolve', 'payments.approve')),
		       (SELECT count(*) FROM audit_event WHERE target_type = 'payment' AND target_id = p.operation_id::text AND outcome = 'error' AND error_code = 'conflict'),
		       (SELECT count(*) FROM audit_event WHERE target_type = 'payment' AND target_id = p.operation_id::text AND outcome = 'ok' AND action = 'payments.resolve_request')
		  FROM payment p JOIN balance_reservation r USING (operation_id) WHERE p.operation_id = $1`, op).
		Scan(&e.status, &e.reservation, &e.ledger, &e.completed, &e.failed, &e.okAudit, &e.conflicts, &e.requests)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func resolveForm(token, outcome string) url.Values {
	return url.Values{"csrf_token": {token}, "expected": {"unknown"}, "outcome": {outcome},
		"reason": {"provider support confirmed by phone"}, "evidence": {"ticket PRV-1234"}}
}

// A resolve sent twice (back and submit, a second tab) tells the operator
// the first one did it; another operator's is "someone else".
func TestASecondResolveSaysWhoActedFirst(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "20.00"})
	oncall, oncallToken := h.signedIn(t, "oncall")
	admin, adminToken := h.signedIn(t, "admin")
	if resp, _ := h.postForm(t, oncall, "/payments/"+op.String()+"/resolve", resolveForm(oncallToken, "succeeded")); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("resolve: %d", resp.StatusCode)
	}
	for _, c := range []struct {
		who   *browser
		token string
		want  string
	}{
		{oncall, oncallToken, "You resolved this payment already: it is completed now."},
		{admin, adminToken, "Someone else acted first: the payment is completed now."},
	} {
		resp, body := h.postForm(t, c.who, "/payments/"+op.String()+"/resolve", resolveForm(c.token, "failed"))
		if resp.StatusCode != http.StatusConflict || !strings.Contains(body, c.want) {
			t.Errorf("second resolve: %d, want 409 saying %q", resp.StatusCode, c.want)
		}
	}
}

// Fifty operators resolve one unknown payment at once: one transition, one
// reservation change, one ledger debit, one payment.completed event, one ok
// audit row; the other forty-nine get 409 and are audited as conflicts.
func TestFiftyConcurrentResolvesOneWins(t *testing.T) {
	t.Parallel()
	h := start(t, options{configure: func(c *web.Config) { c.LoginRate = 10_000 }})
	op, acc := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "120.00"})
	const n, operators = 50, 10
	for i := range operators {
		h.idp.AddUser(fmt.Sprintf("op%d", i), "pw", "oncall")
	}
	type session struct {
		b     *browser
		token string
	}
	sessions := make([]session, operators)
	for i := range sessions {
		b := newBrowser(t)
		h.login(t, b, fmt.Sprintf("op%d", i), "pw", "")
		sessions[i] = session{b, h.csrf(t, b)}
	}
	codes := make([]int, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			s := sessions[i%operators]
			resp, _ := h.postForm(t, s.b, "/payments/"+op.String()+"/resolve", resolveForm(s.token, "succeeded"))
			codes[i] = resp.StatusCode
		}()
	}
	close(gate)
	wg.Wait()
	count := map[int]int{}
	for _, c := range codes {
		count[c]++
	}
	if count[http.StatusSeeOther] != 1 || count[http.StatusConflict] != n-1 {
		t.Fatalf("status codes %v, want one 303 and %d 409", count, n-1)
	}
	e := h.effectsOf(t, op)
	if e.status != "completed" || e.reservation != "finalized" || e.ledger != 1 || e.completed != 1 || e.failed != 0 || e.okAudit != 1 || e.conflicts != n-1 {
		t.Fatalf("effects %+v", e)
	}
	paymentstest.CheckBooks(t, h.pool, acc)
	res, err := audit.Verify(context.Background(), h.pool)
	if err != nil || !res.Intact() {
		t.Fatalf("audit chain: %+v %v", res, err)
	}
}

// A resolve whose audit insert fails rolls back: neither the effect nor an
// ok audit row.
func TestResolveRollbackLeavesNeitherEffectNorAudit(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b, token := h.signedIn(t, "oncall")
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{})
	if _, err := h.pool.Exec(context.Background(), `
		CREATE FUNCTION test_refuse_resolve_audit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'planted failure'; END $$;
		CREATE TRIGGER test_refuse_resolve_audit BEFORE INSERT ON audit_event
		    FOR EACH ROW WHEN (NEW.outcome = 'ok' AND NEW.action = 'payments.resolve') EXECUTE FUNCTION test_refuse_resolve_audit();`); err != nil {
		t.Fatal(err)
	}
	resp, _ := h.postForm(t, b, "/payments/"+op.String()+"/resolve", resolveForm(token, "failed"))
	if resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("resolve with a failing audit: %d, want 500", resp.StatusCode)
	}
	e := h.effectsOf(t, op)
	if e.status != "unknown" || e.reservation != "active" || e.ledger != 0 || e.failed != 0 || e.okAudit != 0 {
		t.Fatalf("after the rollback: %+v", e)
	}
	if n := h.countAudit(t, `action = 'payments.resolve' AND outcome = 'error' AND error_code = 'error' AND target_id = $1`, op.String()); n != 1 {
		t.Errorf("%d error audit rows for the failed attempt, want 1", n)
	}
}

// Reason and evidence are required; a missing one is a field error and
// nothing moves.
func TestResolveNeedsReasonAndEvidence(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b, token := h.signedIn(t, "oncall")
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{})
	form := resolveForm(token, "succeeded")
	form.Set("evidence", " ")
	resp, body := h.postForm(t, b, "/payments/"+op.String()+"/resolve", form)
	if resp.StatusCode != http.StatusUnprocessableEntity || doc(t, body).Find(`[data-testid="evidence-error"]`).Length() != 1 {
		t.Fatalf("%d without evidence", resp.StatusCode)
	}
	// The refused field is marked, described by its error and focused as
	// the page opens (a keyboard user landed at the top of the page).
	d := doc(t, body)
	ev, reason := d.Find(`[data-testid="evidence"]`), d.Find(`[data-testid="reason"]`)
	if ev.AttrOr("aria-invalid", "") != "true" || ev.AttrOr("autofocus", "no") == "no" ||
		d.Find("#"+ev.AttrOr("aria-describedby", "none")).AttrOr("data-testid", "") != "evidence-error" {
		t.Error("the evidence field is not marked, described and focused")
	}
	if _, invalid := reason.Attr("aria-invalid"); invalid || reason.AttrOr("autofocus", "no") != "no" {
		t.Error("the reason, which was given, is marked or focused")
	}
	form.Set("reason", "")
	_, body = h.postForm(t, b, "/payments/"+op.String()+"/resolve", form)
	if d := doc(t, body); d.Find(`[autofocus]`).Length() != 1 || d.Find(`[autofocus]`).AttrOr("data-testid", "") != "reason" ||
		d.Find(`[aria-invalid="true"]`).Length() != 2 {
		t.Errorf("two fields refused: focus on %q, %d marked; want the reason first, both marked",
			d.Find(`[autofocus]`).AttrOr("data-testid", ""), d.Find(`[aria-invalid="true"]`).Length())
	}
	if e := h.effectsOf(t, op); e.status != "unknown" {
		t.Fatalf("moved without evidence: %+v", e)
	}
	// A form that does not say the payment was unknown when seen is a 400,
	// and an attempt in the audit trail like any other refused one.
	form = resolveForm(token, "succeeded")
	form.Set("expected", "processing")
	if resp, _ := h.postForm(t, b, "/payments/"+op.String()+"/resolve", form); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("%d for a form that did not see the payment unknown, want 400", resp.StatusCode)
	}
	if n := h.countAudit(t, `action = 'payments.resolve' AND outcome = 'error' AND error_code = 'bad_request' AND target_id = $1 AND actor_name = 'oncall'`, op.String()); n != 1 {
		t.Errorf("%d audit rows for the refused form, want 1", n)
	}
	if e := h.effectsOf(t, op); e.status != "unknown" {
		t.Fatalf("moved by a refused form: %+v", e)
	}
}

// Above the threshold nothing moves until a different operator approves;
// the requester cannot approve their own request (403, audited); a
// rejection leaves the payment unknown.
func TestFourEyesAboveThreshold(t *testing.T) {
	t.Parallel()
	h := start(t, options{configure: func(c *web.Config) { c.FourEyesAbove = decimal.RequireFromString("100.00") }})
	oncall, oncallToken := h.signedIn(t, "oncall")
	admin, adminToken := h.signedIn(t, "admin")
	op, acc := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "500.00"})

	_, page := oncall.get(t, h.base+"/payments/"+op.String(), "text/html")
	if doc(t, page).Find(`[data-testid="four-eyes-note"]`).Length() != 1 {
		t.Fatal("the form does not say a second operator must approve")
	}
	resp, _ := h.postForm(t, oncall, "/payments/"+op.String()+"/resolve", resolveForm(oncallToken, "succeeded"))
	if resp.StatusCode != http.StatusSeeOther || !strings.HasSuffix(resp.Header.Get("Location"), "done=requested") {
		t.Fatalf("request: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if e := h.effectsOf(t, op); e.status != "unknown" || e.reservation != "active" || e.ledger != 0 || e.requests != 1 {
		t.Fatalf("after the request: %+v", e)
	}
	// A second request while one is pending is a conflict.
	resp, _ = h.postForm(t, admin, "/payments/"+op.String()+"/resolve", resolveForm(adminToken, "failed"))
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("second request: %d, want 409", resp.StatusCode)
	}
	var id int64
	if err := h.pool.QueryRow(context.Background(), `SELECT id FROM payment_approval WHERE operation_id = $1 AND state = 'pending'`, op).Scan(&id); err != nil {
		t.Fatal(err)
	}
	_, list := oncall.get(t, h.base+"/approvals", "text/html")
	if d := doc(t, list); d.Find(`[data-testid="own-request"]`).Length() != 1 || d.Find(`[data-testid="approve"]`).Length() != 0 {
		t.Error("the requester is offered their own request to approve")
	}
	resp, _ = h.postForm(t, oncall, fmt.Sprintf("/approvals/%d/approve", id), url.Values{"csrf_token": {oncallToken}})
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("self-approval: %d, want 403", resp.StatusCode)
	}
	if n := h.countAudit(t, `action = 'payments.approve' AND outcome = 'denied' AND error_code = 'self_approval' AND target_id = $1`, op.String()); n != 1 {
		t.Errorf("%d denied self-approval audit rows, want 1", n)
	}
	if e := h.effectsOf(t, op); e.status != "unknown" || e.ledger != 0 {
		t.Fatalf("after the self-approval: %+v", e)
	}
	_, list = admin.get(t, h.base+"/approvals", "text/html")
	if doc(t, list).Find(`[data-testid="approve"]`).Length() != 1 {
		t.Fatal("a second operator sees no approve button")
	}
	resp, _ = h.postForm(t, admin, fmt.Sprintf("/approvals/%d/approve", id), url.Values{"csrf_token": {adminToken}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("approve: %d", resp.StatusCode)
	}
	if e := h.effectsOf(t, op); e.status != "completed" || e.reservation != "finalized" || e.ledger != 1 || e.completed != 1 || e.okAudit != 1 {
		t.Fatalf("after the approval: %+v", e)
	}
	paymentstest.CheckBooks(t, h.pool, acc)
	// The page names both operators (resolved_by keeps their ids).
	_, page = admin.get(t, h.base+"/payments/"+op.String(), "text/html")
	if got := strings.Join(strings.Fields(doc(t, page).Find(`[data-testid="resolved-by"]`).Text()), " "); !strings.HasPrefix(got, "operator oncall, approved by admin") {
		t.Fatalf("resolved by %q, want the two operators' names", got)
	}
	// Approving again: decided already, by the same operator, who is told so.
	resp, body := h.postForm(t, admin, fmt.Sprintf("/approvals/%d/approve", id), url.Values{"csrf_token": {adminToken}})
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("second approval: %d, want 409", resp.StatusCode)
	}
	if !strings.Contains(body, "You decided this request already (approved)") {
		t.Errorf("the second approval by the same operator does not say they decided it: %s", body)
	}

	// Rejection leaves the payment unknown.
	op2, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "700.00"})
	resp, _ = h.postForm(t, admin, "/payments/"+op2.String()+"/resolve", resolveForm(adminToken, "failed"))
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("request 2: %d", resp.StatusCode)
	}
	if err := h.pool.QueryRow(context.Background(), `SELECT id FROM payment_approval WHERE operation_id = $1 AND state = 'pending'`, op2).Scan(&id); err != nil {
		t.Fatal(err)
	}
	// A rejection says why (the auditor reads why the money did not move).
	resp, body = h.postForm(t, oncall, fmt.Sprintf("/approvals/%d/reject", id), url.Values{"csrf_token": {oncallToken}, "reason": {"  "}})
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(doc(t, body).Find(`[data-testid="problem"]`).Text(), "needs a reason") {
		t.Fatalf("reject without a reason: %d, want 422 saying a reason is needed", resp.StatusCode)
	}
	if n := h.countAudit(t, `action = 'payments.reject' AND outcome = 'error' AND error_code = 'invalid' AND target_id = $1`, op2.String()); n != 1 {
		t.Errorf("%d audited refusals of a reject without a reason, want 1", n)
	}
	resp, _ = h.postForm(t, oncall, fmt.Sprintf("/approvals/%d/reject", id), url.Values{"csrf_token": {oncallToken}, "reason": {"bank statement shows no debit"}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("reject: %d", resp.StatusCode)
	}
	if e := h.effectsOf(t, op2); e.status != "unknown" || e.reservation != "active" || e.ledger != 0 || e.failed != 0 {
		t.Fatalf("after the rejection: %+v", e)
	}
	if n := h.countAudit(t, `action = 'payments.reject' AND outcome = 'ok' AND target_id = $1 AND reason = 'bank statement shows no debit'`, op2.String()); n != 1 {
		t.Errorf("%d reject audit rows, want 1", n)
	}
}

// A request whose payment was settled another way (a settlement file, the
// reconcile worker) is marked on the approvals page: no approve button,
// which could only answer 409, and the rejection that closes it.
func TestStaleFourEyesRequestIsMarked(t *testing.T) {
	t.Parallel()
	h := start(t, options{configure: func(c *web.Config) { c.FourEyesAbove = decimal.RequireFromString("100.00") }})
	oncall, oncallToken := h.signedIn(t, "oncall")
	admin, adminToken := h.signedIn(t, "admin")
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "500.00"})
	if resp, _ := h.postForm(t, oncall, "/payments/"+op.String()+"/resolve", resolveForm(oncallToken, "succeeded")); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("request: %d", resp.StatusCode)
	}
	_, list := admin.get(t, h.base+"/approvals", "text/html")
	if d := doc(t, list); d.Find(`[data-testid="approve"]`).Length() != 1 || d.Find(`[data-testid="approval-stale"]`).Length() != 0 {
		t.Fatalf("a live request: %s", list)
	}
	// Settled by a file, as `console payments reconcile` does.
	if err := db.WithTx(context.Background(), h.pool, func(tx pgx.Tx) error {
		_, err := payments.Resolve(context.Background(), tx, op, payments.OutcomeFailed, payments.ResolveOptions{ResolvedBy: "settlement:test"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	_, list = admin.get(t, h.base+"/approvals", "text/html")
	d := doc(t, list)
	if got := d.Find(`[data-testid="approval-stale"]`).Text(); !strings.Contains(got, "now failed") || !strings.Contains(got, "rejecting the request closes it") {
		t.Errorf("the stale request is not marked: %q", got)
	}
	if d.Find(`[data-testid="approve"]`).Length() != 0 || d.Find(`[data-testid="reject"]`).Length() != 1 {
		t.Errorf("a stale request offers approve, or no reject: %s", list)
	}
	var id int64
	if err := h.pool.QueryRow(context.Background(), `SELECT id FROM payment_approval WHERE operation_id = $1 AND state = 'pending'`, op).Scan(&id); err != nil {
		t.Fatal(err)
	}
	resp, _ := h.postForm(t, admin, fmt.Sprintf("/approvals/%d/reject", id), url.Values{"csrf_token": {adminToken}, "reason": {"settled by the provider's file"}})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/approvals?done=closed" {
		t.Fatalf("reject: %d %q, want 303 to the list saying the request was closed", resp.StatusCode, resp.Header.Get("Location"))
	}
	if e := h.effectsOf(t, op); e.status != "failed" {
		t.Fatalf("the rejection moved the payment: %+v", e)
	}
	// Its audit row names the payment as it was (failed), not the unknown
	// a rejection of a live request leaves, and the rejecter's reason, not
	// the requester's.
	if n := h.countAudit(t, `action = 'payments.reject' AND outcome = 'ok' AND target_id = $1 AND before->>'status' = 'failed'
		AND after->>'status' = 'failed' AND reason = 'settled by the provider''s file'`, op.String()); n != 1 {
		t.Errorf("%d reject rows with the payment's real status and the rejecter's reason, want 1", n)
	}
	_, list = admin.get(t, h.base+"/approvals?done=closed", "text/html")
	if got := doc(t, list).Find(`[data-testid="notice"]`).Text(); !strings.Contains(got, "settled another way") {
		t.Errorf("the notice after closing reads %q", got)
	}
}

// Each approvals row says which invoice the payment is, its amount and its
// status now (read with the request), so an approver sees the payment is
// still unknown without opening it; a payment settled meanwhile shows its
// new status in its row.
func TestApprovalRowsShowTheirPaymentNow(t *testing.T) {
	t.Parallel()
	h := start(t, options{configure: func(c *web.Config) { c.FourEyesAbove = decimal.RequireFromString("100.00") }})
	oncall, oncallToken := h.signedIn(t, "oncall")
	admin, _ := h.signedIn(t, "admin")
	first, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "500.00", Merchant: "m-east", Invoice: "inv-east-17"})
	second, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "1234.50", Merchant: "m-west", Invoice: "inv-west-42"})
	for _, op := range []uuid.UUID{first, second} {
		if resp, _ := h.postForm(t, oncall, "/payments/"+op.String()+"/resolve", resolveForm(oncallToken, "succeeded")); resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("request: %d", resp.StatusCode)
		}
	}
	if err := db.WithTx(context.Background(), h.pool, func(tx pgx.Tx) error {
		_, err := payments.Resolve(context.Background(), tx, second, payments.OutcomeSucceeded, payments.ResolveOptions{ResolvedBy: "settlement:test"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	_, list := admin.get(t, h.base+"/approvals", "text/html")
	d := doc(t, list)
	want := map[string][4]string{ // link, invoice, amount, status now
		first.String():  {"/payments/" + first.String(), "inv-east-17 of m-east", "500.00 TRY", "unknown"},
		second.String(): {"/payments/" + second.String(), "inv-west-42 of m-west", "1234.50 TRY", "completed"},
	}
	rows := d.Find(`[data-testid="approval-row"]`)
	if rows.Length() != 2 {
		t.Fatalf("%d approval rows, want 2: %s", rows.Length(), list)
	}
	words := func(s *goquery.Selection) string { return strings.Join(strings.Fields(s.Text()), " ") }
	rows.Each(func(_ int, r *goquery.Selection) {
		link := r.Find(`[data-testid="approval-link"]`).AttrOr("href", "")
		w, ok := want[strings.TrimPrefix(link, "/payments/")]
		if !ok {
			t.Errorf("a row links %q", link)
			return
		}
		got := [4]string{link, words(r.Find(`[data-testid="approval-invoice"]`)), words(r.Find(`[data-testid="approval-amount"]`)),
			words(r.Find(`[data-testid="approval-payment-status"]`))}
		if got != w {
			t.Errorf("row %v, want %v", got, w)
		}
		if m := r.Find(`[data-testid="approval-merchant"]`).Text(); m != strings.Split(w[1], " of ")[1] {
			t.Errorf("row of %s names merchant %q", w[1], m)
		}
	})
	// The payment's own page lists its requests without repeating what it
	// says above them.
	_, page := admin.get(t, h.base+"/payments/"+first.String(), "text/html")
	if p := doc(t, page); p.Find(`[data-testid="approval-row"]`).Length() != 1 || p.Find(`[data-testid="approval-invoice"], [data-testid="approval-payment-status"]`).Length() != 0 {
		t.Errorf("the payment page's requests: %d rows, %d invoice or status cells; want 1 row and neither", p.Find(`[data-testid="approval-row"]`).Length(),
			p.Find(`[data-testid="approval-invoice"], [data-testid="approval-payment-status"]`).Length())
	}
}

// A sign-in older than CONSOLE_RECENT_LOGIN cannot resolve: the refusal is
// audited and the browser is sent to sign in again, back to the payment.
func TestResolveNeedsRecentLogin(t *testing.T) {
	t.Parallel()
	var offset atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	h := start(t, options{clock: clock, configure: func(c *web.Config) { c.RecentLogin = time.Minute }})
	b, token := h.signedIn(t, "oncall")
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{})
	offset.Store(int64(2 * time.Minute))
	resp, _ := h.postForm(t, b, "/payments/"+op.String()+"/resolve", resolveForm(token, "succeeded"))
	want := "/login?reauth=1&next=" + url.QueryEscape("/payments/"+op.String())
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != want {
		t.Fatalf("stale login: %d %q, want 303 %q", resp.StatusCode, resp.Header.Get("Location"), want)
	}
	if e := h.effectsOf(t, op); e.status != "unknown" {
		t.Fatalf("moved with a stale login: %+v", e)
	}
	if n := h.countAudit(t, `action = 'request.denied' AND reason = 'reauth'`); n < 1 {
		// RecordDenied's row names the reason in its own column or error code.
		if n2 := h.countAudit(t, `action = 'request.denied' AND error_code = 'reauth'`); n2 != 1 {
			t.Errorf("the refusal is not audited (%d, %d)", n, n2)
		}
	}
}

// A settlement file moves money as a typed resolution does, so it needs a
// recent sign-in too: a dry run made in time cannot be confirmed once the
// sign-in is too old, and a new upload is sent to sign in again; both
// refusals are audited and settle nothing. (The confirmation skipped the
// check: a stale session settled any number of payments at or below the
// four-eyes threshold.)
func TestSettlementNeedsRecentLogin(t *testing.T) {
	t.Parallel()
	var offset atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	h := start(t, options{clock: clock, configure: func(c *web.Config) { c.RecentLogin = time.Minute }})
	b, token := h.signedIn(t, "oncall")
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "20.00"})
	file := op.String() + ",failed\n"
	resp, body := h.upload(t, b, token, file)
	sha := doc(t, body).Find(`input[name="confirm_sha256"]`).AttrOr("value", "")
	if resp.StatusCode != http.StatusOK || sha == "" {
		t.Fatalf("dry run with a fresh sign-in: %d, confirmation %q", resp.StatusCode, sha)
	}
	offset.Store(int64(2 * time.Minute))
	want := "/login?reauth=1&next=" + url.QueryEscape("/payments/settlements")
	for name, post := range map[string]func() (*http.Response, string){
		"confirm": func() (*http.Response, string) { return h.confirm(t, b, token, sha) },
		"upload":  func() (*http.Response, string) { return h.upload(t, b, token, file) },
	} {
		if resp, _ := post(); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != want {
			t.Errorf("%s with a stale sign-in: %d %q, want 303 %q", name, resp.StatusCode, resp.Header.Get("Location"), want)
		}
	}
	if e := h.effectsOf(t, op); e.status != "unknown" {
		t.Fatalf("a stale sign-in settled the payment: %+v", e)
	}
	if n := h.countAudit(t, `action = 'request.denied' AND (reason = 'reauth' OR error_code = 'reauth')`); n != 2 {
		t.Errorf("%d audited refusals, want 2", n)
	}
	_, page := b.get(t, h.base+"/payments/settlements", "text/html")
	if got := doc(t, page).Find(`[data-testid="reauth-link"]`).AttrOr("href", ""); got != want {
		t.Errorf("the page's sign-in link %q, want %q", got, want)
	}
}

// Approving a four-eyes request moves money: a stale sign-in is sent to
// sign in again, audited, and the payment stays unknown; rejecting moves
// nothing and needs no fresh sign-in.
func TestApproveNeedsRecentLogin(t *testing.T) {
	t.Parallel()
	var offset atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	h := start(t, options{clock: clock, configure: func(c *web.Config) {
		c.RecentLogin = time.Minute
		c.FourEyesAbove = decimal.RequireFromString("100.00")
	}})
	oncall, oncallToken := h.signedIn(t, "oncall")
	admin, adminToken := h.signedIn(t, "admin")
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "500.00"})
	if resp, _ := h.postForm(t, oncall, "/payments/"+op.String()+"/resolve", resolveForm(oncallToken, "succeeded")); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("request: %d", resp.StatusCode)
	}
	var id int64
	if err := h.pool.QueryRow(context.Background(), `SELECT id FROM payment_approval WHERE operation_id = $1 AND state = 'pending'`, op).Scan(&id); err != nil {
		t.Fatal(err)
	}
	_, page := admin.get(t, h.base+"/approvals", "text/html")
	if doc(t, page).Find(`[data-testid="reauth"]`).Length() != 0 {
		t.Error("the approvals page asks a fresh sign-in to sign in again")
	}
	offset.Store(int64(2 * time.Minute))
	// The page says so before an Approve is lost to the sign-in round trip.
	_, page = admin.get(t, h.base+"/approvals", "text/html")
	if got := doc(t, page).Find(`[data-testid="reauth-link"]`).AttrOr("href", ""); got != "/login?reauth=1&next="+url.QueryEscape("/approvals") {
		t.Errorf("the approvals page's sign-in link with a stale sign-in: %q", got)
	}
	resp, _ := h.postForm(t, admin, fmt.Sprintf("/approvals/%d/approve", id), url.Values{"csrf_token": {adminToken}})
	if want := "/login?reauth=1&next=" + url.QueryEscape("/approvals"); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != want {
		t.Fatalf("approve with a stale sign-in: %d %q, want 303 %q", resp.StatusCode, resp.Header.Get("Location"), want)
	}
	if e := h.effectsOf(t, op); e.status != "unknown" || e.ledger != 0 {
		t.Fatalf("a stale sign-in approved: %+v", e)
	}
	if n := h.countAudit(t, `action = 'request.denied' AND (reason = 'reauth' OR error_code = 'reauth')`); n != 1 {
		t.Errorf("%d audited refusals, want 1", n)
	}
	if resp, _ := h.postForm(t, admin, fmt.Sprintf("/approvals/%d/reject", id), url.Values{"csrf_token": {adminToken}, "reason": {"wrong outcome"}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("reject with a stale sign-in: %d, want 303 to the list", resp.StatusCode)
	}
}

// The list: unknown first (oldest first), filters, keyset pages, 400 on a
// forged cursor; reconcile age and last inquiry on unknown rows.
func TestPaymentListOrderFiltersAndPages(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b, _ := h.signedIn(t, "support")
	acc := paymentstest.Account(t, h.pool, paymentstest.AccountOpts{ID: 77, Balance: "100000"})
	var unknown []uuid.UUID
	for i := range 3 {
		op := paymentstest.Payment(t, h.pool, paymentstest.PaymentOpts{Account: acc, Merchant: "m1", Age: time.Duration(3-i) * time.Hour})
		unknown = append(unknown, op)
	}
	for i := range 4 {
		paymentstest.Payment(t, h.pool, paymentstest.PaymentOpts{Account: acc, Merchant: "m2", Status: payments.StatusCompleted, Amount: fmt.Sprintf("%d.00", 10+i), Age: time.Duration(i) * time.Minute})
	}
	failed := paymentstest.Payment(t, h.pool, paymentstest.PaymentOpts{Account: acc, Merchant: "m2", Status: payments.StatusFailed, Invoice: "inv-failed"})

	// An invoice with no payment: the empty list says that a request refused
	// before any money was held makes none (support looked for a declined
	// one and found only "No payments match").
	_, none := b.get(t, h.base+"/payments?invoice_id=INV-refused", "text/html")
	if got := doc(t, none).Find(`[data-testid="empty-refused"]`).Text(); !strings.Contains(got, "makes no payment") || !strings.Contains(got, "insufficient_funds") {
		t.Errorf("the empty list does not say where refused requests are: %q", got)
	}

	ids := func(body string) []string {
		var out []string
		d := doc(t, body)
		for i := range d.Find(`[data-testid="row"]`).Length() {
			v, _ := d.Find(`[data-testid="row"]`).Eq(i).Attr("data-id")
			out = append(out, v)
		}
		return out
	}
	resp, body := b.get(t, h.base+"/payments", "text/html")
	got := ids(body)
	if resp.StatusCode != 200 || len(got) != 8 {
		t.Fatalf("%d, %d rows", resp.StatusCode, len(got))
	}
	for i, op := range unknown {
		if got[i] != op.String() {
			t.Fatalf("row %d is %s, want the unknown %s (oldest first)", i, got[i], op)
		}
	}
	if got[3] != failed.String() {
		t.Errorf("row 3 is %s, want the failed payment", got[3])
	}
	// The heading says the order the rows are in.
	if line := doc(t, body).Find(`[data-testid="count"]`).Text(); !strings.Contains(line, "longest unknown on top") || !strings.Contains(line, "each newest first") {
		t.Errorf("the list's heading %q does not say its order", line)
	}
	d := doc(t, body)
	if d.Find(`[data-testid="reconcile-age"]`).Length() != 3 || !strings.Contains(d.Find(`[data-testid="last-inquiry"]`).First().Text(), "not inquired yet") {
		t.Error("unknown rows lack the reconcile age or the last inquiry")
	}
	// Keyset pages of 3 walk every row once.
	var walked []string
	u := h.base + "/payments"
	for range 10 {
		resp, body = b.get(t, u, "text/html")
		if resp.StatusCode != 200 {
			t.Fatalf("page: %d", resp.StatusCode)
		}
		walked = append(walked, ids(body)...)
		href, ok := doc(t, body).Find(`[data-testid="next"]`).Attr("href")
		if !ok {
			break
		}
		u = h.base + href
	}
	if strings.Join(walked, ",") != strings.Join(got, ",") {
		t.Errorf("paging walked %v, want %v", walked, got)
	}
	// Filters.
	for q, want := range map[string]int{
		"status=unknown": 3, "status=completed": 4, "merchant_id=m2": 5, "invoice_id=inv-failed": 1,
		"operation_id=" + unknown[0].String(): 1, "amount_min=11&amount_max=12.5": 2, "merchant_id=m1&status=failed": 0,
	} {
		resp, body = b.get(t, h.base+"/payments?"+q, "text/html")
		if resp.StatusCode != 200 || len(ids(body)) != want {
			t.Errorf("%s: %d, %d rows, want %d", q, resp.StatusCode, len(ids(body)), want)
		}
	}
	for _, q := range []string{"after=garbage", "status=nope", "amount_min=abc", "operation_id=1"} {
		if resp, _ = b.get(t, h.base+"/payments?"+q, "text/html"); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", q, resp.StatusCode)
		}
	}
}

// The list's own pages with a small limit: a cursor of another filter is
// refused.
func TestPaymentListCursorOfAnotherFilterIsRefused(t *testing.T) {
	t.Parallel()
	pool := start(t, options{}).pool
	acc := paymentstest.Account(t, pool, paymentstest.AccountOpts{ID: 78, Balance: "1000"})
	for range 5 {
		paymentstest.Payment(t, pool, paymentstest.PaymentOpts{Account: acc})
	}
	for _, st := range []payments.Status{payments.StatusCompleted, payments.StatusFailed, payments.StatusCompleted} {
		paymentstest.Payment(t, pool, paymentstest.PaymentOpts{Account: acc, Status: st})
	}
	ctx := context.Background()
	all, err := payments.ListPayments(ctx, pool, payments.Filter{}, payments.Page{})
	if err != nil || len(all.Rows) != 8 {
		t.Fatalf("%v %d", err, len(all.Rows))
	}
	var walked []payments.Payment
	after := ""
	for range 10 {
		pg, err := payments.ListPayments(ctx, pool, payments.Filter{}, payments.Page{Limit: 2, After: after})
		if err != nil {
			t.Fatal(err)
		}
		walked = append(walked, pg.Rows...)
		if after = pg.Next; after == "" {
			break
		}
	}
	if len(walked) != len(all.Rows) {
		t.Fatalf("pages of 2 walked %d rows, want %d", len(walked), len(all.Rows))
	}
	for i := range walked {
		if walked[i].OperationID != all.Rows[i].OperationID {
			t.Fatalf("row %d differs between the pages and the whole list", i)
		}
	}
	p1, err := payments.ListPayments(ctx, pool, payments.Filter{}, payments.Page{Limit: 2})
	if err != nil || len(p1.Rows) != 2 || p1.Next == "" {
		t.Fatalf("%v %d %q", err, len(p1.Rows), p1.Next)
	}
	if _, err := payments.ListPayments(ctx, pool, payments.Filter{MerchantID: "x"}, payments.Page{Limit: 2, After: p1.Next}); err == nil {
		t.Fatal("a cursor of another filter was accepted")
	}
}

// The detail page shows the parts; customer data never appears in clear on
// any page; hostile text in the invoice id, merchant id and reason is inert.
func TestPaymentPagesShowPartsAndNoCanaryAndInertText(t *testing.T) {
	t.Parallel()
	h := start(t, options{configure: func(c *web.Config) { c.FourEyesAbove = decimal.RequireFromString("100.00") }})
	oncall, token := h.signedIn(t, "oncall")
	kr := paymentstest.Keyring(t)
	const canary = "canary-7f3a9d@example.org"
	opID, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	env, err := kr.Seal(payments.CustomerPlace(opID), "email", canary)
	if err != nil {
		t.Fatal(err)
	}
	nameEnv, err := kr.Seal(payments.CustomerPlace(opID), "name", "Canary Name")
	if err != nil {
		t.Fatal(err)
	}
	hostile := `<script>alert(1)</script>" onmouseover="alert(2)" hx-get="/logout"`
	acc := paymentstest.Account(t, h.pool, paymentstest.AccountOpts{ID: 79, Balance: "100000"})
	op := paymentstest.Payment(t, h.pool, paymentstest.PaymentOpts{Account: acc, Merchant: "m" + hostile, Invoice: "inv" + hostile,
		Amount: "500.00", Customer: map[string]string{"email": env, "name": nameEnv}, OperationID: opID})
	paymentstest.StoredAnswer(t, h.pool, paymentstest.AnswerOpts{Merchant: "m" + hostile, Key: "k1", OperationID: op,
		Status: payments.StatusUnknown, ResponseStatus: 202, ResponseBody: `{"customer":{"email":"` + canary + `"}}`})
	form := resolveForm(token, "failed")
	form.Set("reason", "reason "+hostile)
	form.Set("evidence", "evidence "+hostile)
	if resp, _ := h.postForm(t, oncall, "/payments/"+op.String()+"/resolve", form); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("request: %d", resp.StatusCode)
	}
	pages := map[string]string{}
	for _, p := range []string{"/payments", "/payments?status=unknown", "/payments/" + op.String(), "/approvals"} {
		resp, body := oncall.get(t, h.base+p, "text/html")
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", p, resp.StatusCode)
		}
		pages[p] = body
		if strings.Contains(body, canary) || strings.Contains(body, "canary-7f3a9d") {
			t.Errorf("%s shows the customer canary", p)
		}
		assertInert(t, p, body)
	}
	d := doc(t, pages["/payments/"+op.String()])
	for _, id := range []string{"payment", "record", "reservation", "ledger", "events", "approvals", "customer"} {
		if d.Find(`[data-testid="`+id+`"]`).Length() == 0 {
			t.Errorf("the detail page has no %s part", id)
		}
	}
	// The audit trail is the auditor's and the admin's (DESIGN.md's roles):
	// an operator's page has no Audit trail panel, an admin's has it, inert.
	if d.Find(`[data-testid="audit"], [data-testid="audit-empty"]`).Length() != 0 {
		t.Error("an operator's payment page shows the audit trail")
	}
	admin, _ := h.signedIn(t, "admin")
	_, adminPage := admin.get(t, h.base+"/payments/"+op.String(), "text/html")
	if rows := doc(t, adminPage).Find(`[data-testid="audit-row"]`); rows.Length() == 0 || !strings.Contains(rows.Text(), "payments.resolve_request") {
		t.Errorf("an admin's payment page has no audit row of the request: %q", rows.Text())
	}
	if strings.Contains(adminPage, canary) {
		t.Error("the admin's payment page shows the customer canary")
	}
	assertInert(t, "admin /payments/"+op.String(), adminPage)
	if got := d.Find(`[data-testid="record-response"]`).Text(); got != "HTTP 202" {
		t.Errorf("stored response shown as %q", got)
	}
	// This console holds no keys; each field apart from the next.
	// (Less the words for screen readers and the note under the values,
	// which says they are sealed.)
	customer := d.Find(`[data-testid="customer"]`).Clone()
	note := squashed(customer.Find(`[data-testid="customer-masked"]`))
	customer.Find(`.sr, [data-testid="customer-masked"]`).Remove()
	if got := strings.TrimSpace(customer.Text()); got != "email: [encrypted]; name: [encrypted]" {
		t.Errorf("customer shown as %q, want each field masked and apart", got)
	}
	if !strings.HasPrefix(note, "Sealed: this console holds no personal-data keys") {
		t.Errorf("the note under sealed values reads %q", note)
	}
	// A resolved payment links its payment.* event.
	small := paymentstest.Payment(t, h.pool, paymentstest.PaymentOpts{Account: acc, Amount: "10.00"})
	if resp, _ := h.postForm(t, oncall, "/payments/"+small.String()+"/resolve", resolveForm(token, "succeeded")); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("resolve: %d", resp.StatusCode)
	}
	_, body := oncall.get(t, h.base+"/payments/"+small.String(), "text/html")
	if doc(t, body).Find(`[data-testid="events"] a[href^="/outbox/"]`).Length() != 1 {
		t.Error("no link to the payment's outbox event")
	}
}

// Inquire without a provider: no button, and 503. With one: the answer is
// recorded on the payment and audited.
func TestInquire(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b, token := h.signedIn(t, "oncall")
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{})
	_, page := b.get(t, h.base+"/payments/"+op.String(), "text/html")
	if doc(t, page).Find(`[data-testid="action-inquire"]`).Length() != 0 {
		t.Error("an inquire button without a provider")
	}
	if resp, _ := h.postForm(t, b, "/payments/"+op.String()+"/inquire", url.Values{"csrf_token": {token}}); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("inquire without a provider: %d, want 503", resp.StatusCode)
	}
}

// A client retrying with the same Idempotency-Key after a console resolve
// gets the resolved outcome.
func TestClientRetryAfterConsoleResolve(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	api := newPaymentsAPI(t, h.pool)
	b, token := h.signedIn(t, "oncall")
	api.sim.Next(provider.BehaveTimeoutAfterCharge)
	first := api.post(t, "key-1", `{"invoice_id":"inv-r","account_id":4242,"amount":"12.00","currency":"TRY","customer":{"name":"A B","email":"a@b.example","tax_id":"12345678901"}}`)
	if first.status != http.StatusAccepted {
		t.Fatalf("first answer %d %s, want 202 unknown", first.status, first.body)
	}
	op := uuid.MustParse(first.json(t)["operation_id"].(string))
	resp, _ := h.postForm(t, b, "/payments/"+op.String()+"/resolve", resolveForm(token, "succeeded"))
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("resolve: %d", resp.StatusCode)
	}
	again := api.post(t, "key-1", `{"invoice_id":"inv-r","account_id":4242,"amount":"12.00","currency":"TRY","customer":{"name":"A B","email":"a@b.example","tax_id":"12345678901"}}`)
	if again.status != http.StatusCreated || again.json(t)["status"] != "completed" || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %s %v", again.status, again.body, again.header)
	}
	if api.sim.MoneyMoved() != 1 {
		t.Errorf("the provider moved money %d times", api.sim.MoneyMoved())
	}
}

// Settlement upload: a bad file changes nothing and names the line; a good
// one shows its dry run, then applies once with one audit row per settled
// payment naming the file's hash.
func TestSettlementUpload(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b, token := h.signedIn(t, "oncall")
	// The page is found from the payments list by who may use it, and only
	// by them.
	_, list := b.get(t, h.base+"/payments", "text/html")
	if href := doc(t, list).Find(`[data-testid="settlements-link"]`).AttrOr("href", ""); href != "/payments/settlements" {
		t.Errorf("an operator's payments list links the settlement page at %q", href)
	}
	support, _ := h.signedIn(t, "support")
	_, list = support.get(t, h.base+"/payments", "text/html")
	if doc(t, list).Find(`[data-testid="settlements-link"]`).Length() != 0 {
		t.Error("a viewer's payments list links the settlement page, which refuses viewers")
	}
	op1, _ := h.unknownPayment(t, paymentstest.PaymentOpts{})
	op2, _ := h.unknownPayment(t, paymentstest.PaymentOpts{})
	done, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Status: payments.StatusCompleted})
	stranger := uuid.New()

	bad := op1.String() + ",succeeded\nnot-a-uuid,failed\n"
	resp, body := h.upload(t, b, token, bad)
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(doc(t, body).Find(`[data-testid="problem-line"]`).Text(), "line 2") {
		t.Fatalf("bad file: %d %s", resp.StatusCode, doc(t, body).Find(`[data-testid="problem"]`).Text())
	}
	if e := h.effectsOf(t, op1); e.status != "unknown" {
		t.Fatal("a bad file changed a payment")
	}

	good := "operation_id,outcome,provider_ref\n" + op1.String() + ",succeeded,r1\n" + op2.String() + ",failed\n" + done.String() + ",failed\n" + stranger.String() + ",succeeded\n"
	resp, body = h.upload(t, b, token, good)
	if resp.StatusCode != 200 {
		t.Fatalf("good file: %d", resp.StatusCode)
	}
	d := doc(t, body)
	results := map[string]int{}
	d.Find(`[data-testid="diff-row"]`).Each(func(_ int, s *goquery.Selection) {
		r, _ := s.Attr("data-result")
		results[r]++
	})
	if results["resolved"] != 2 || results["discrepancy"] != 1 || results["not_found"] != 1 {
		t.Fatalf("dry run %v", results)
	}
	if e := h.effectsOf(t, op1); e.status != "unknown" {
		t.Fatal("the dry run changed a payment")
	}
	sha, _ := d.Find(`input[name="confirm_sha256"]`).Attr("value")
	if len(sha) != 64 {
		t.Fatalf("no hash in the confirmation: %q", sha)
	}
	resp, body = h.confirm(t, b, token, sha)
	if resp.StatusCode != 200 {
		t.Fatalf("confirm: %d", resp.StatusCode)
	}
	if n := doc(t, body).Find(`[data-testid="notice"]`); !strings.Contains(n.Text(), "1 line contradicts a final payment (1 new discrepancy)") ||
		!strings.Contains(n.Text(), "1 line names no payment of ours") || n.Find(`[data-testid="notice-discrepancies"]`).AttrOr("href", "") != "/payments/discrepancies" {
		t.Errorf("the notice after applying reads %q", strings.Join(strings.Fields(n.Text()), " "))
	}
	if e := h.effectsOf(t, op1); e.status != "completed" || e.ledger != 1 {
		t.Fatalf("op1 after apply: %+v", e)
	}
	if e := h.effectsOf(t, op2); e.status != "failed" || e.reservation != "released" {
		t.Fatalf("op2 after apply: %+v", e)
	}
	// Applying again changes nothing and writes no more audit rows.
	if resp, _ = h.confirm(t, b, token, sha); resp.StatusCode != 200 {
		t.Fatalf("confirm again: %d", resp.StatusCode)
	}
	for _, op := range []uuid.UUID{op1, op2} {
		if n := h.countAudit(t, `action = 'payments.settle' AND outcome = 'ok' AND target_id = $1 AND evidence LIKE $2 AND actor_name = 'oncall'`,
			op.String(), "settlement sha256:"+sha+" line %"); n != 1 {
			t.Errorf("%s: %d settle audit rows naming the hash, want 1", op, n)
		}
	}
	if n := h.countAudit(t, `action = 'payments.settle'`); n != 2 {
		t.Errorf("%d settle audit rows in all, want 2", n)
	}
	// The lines that settle nothing but need someone are audited once too:
	// the contradicted payment, the charge with no payment of ours.
	for action, op := range map[string]uuid.UUID{"payments.settle_discrepancy": done, "payments.settle_not_found": stranger} {
		if n := h.countAudit(t, `action = $1 AND outcome = 'ok' AND target_type = 'payment' AND target_id = $2 AND evidence LIKE $3 AND actor_name = 'oncall'`,
			action, op.String(), "settlement sha256:"+sha+" line %"); n != 1 {
			t.Errorf("%s of %s: %d audit rows naming the hash, want 1", action, op, n)
		}
	}
}

func (h *harness) upload(t *testing.T, b *browser, token, file string) (*http.Response, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	_ = mw.WriteField("csrf_token", token)
	fw, _ := mw.CreateFormFile("file", "eod.csv")
	_, _ = io.WriteString(fw, file)
	_ = mw.Close()
	return h.postMultipart(t, b, &buf, mw.FormDataContentType())
}

func (h *harness) confirm(t *testing.T, b *browser, token, sha string) (*http.Response, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	_ = mw.WriteField("csrf_token", token)
	_ = mw.WriteField("confirm_sha256", sha)
	_ = mw.Close()
	return h.postMultipart(t, b, &buf, mw.FormDataContentType())
}

func (h *harness) postMultipart(t *testing.T, b *browser, body io.Reader, ctype string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.base+"/payments/settlements", body)
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("Accept", "text/html")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := b.noRedirects().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(data)
}

// Inquire with a provider: the answer is recorded on the payment and
// audited; a definite answer resolves the payment as the reconcile worker
// would.
func TestInquireRecordsTheAnswerAndResolvesWhenDefinite(t *testing.T) {
	t.Parallel()
	sim := provider.NewSimulator(provider.SimConfig{})
	if err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	h := start(t, options{configure: func(c *web.Config) { c.ProviderURL = sim.URL() }})
	b, token := h.signedIn(t, "oncall")
	op, acc := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "33.00"})
	if resp, _ := h.postForm(t, b, "/payments/"+op.String()+"/inquire", url.Values{"csrf_token": {token}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("inquire: %d", resp.StatusCode)
	}
	p, err := payments.Get(context.Background(), h.pool, op)
	if err != nil || p.Status != payments.StatusUnknown || p.LastInquiryAnswer != "not_found" || p.LastInquiryAt == nil {
		t.Fatalf("after a not_found answer: %+v %v", p, err)
	}
	_, list := b.get(t, h.base+"/payments?status=unknown", "text/html")
	if got := doc(t, list).Find(`[data-testid="last-inquiry"]`).Text(); !strings.Contains(got, "provider has no such charge") {
		t.Errorf("the list says %q about the last inquiry", got)
	}
	_, detail := b.get(t, h.base+"/payments/"+op.String(), "text/html")
	if calls := doc(t, detail).Find(`[data-testid="provider-call"]`); calls.Length() != 1 || !strings.Contains(calls.Text(), "inquire") ||
		!strings.Contains(calls.Find(`[data-testid="call-answer"]`).Text(), "provider has no such charge") {
		t.Errorf("the payment page lists its provider calls as %q", calls.Text())
	}
	// The provider charged it after all.
	if _, err := provider.NewClient(sim.URL(), 5*time.Second).Charge(context.Background(), provider.ChargeRequest{OperationID: op, Amount: p.Amount, Currency: p.Currency}); err != nil {
		t.Fatal(err)
	}
	if resp, _ := h.postForm(t, b, "/payments/"+op.String()+"/inquire", url.Values{"csrf_token": {token}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("inquire: %d", resp.StatusCode)
	}
	if e := h.effectsOf(t, op); e.status != "completed" || e.ledger != 1 || e.completed != 1 {
		t.Fatalf("after a succeeded answer: %+v", e)
	}
	paymentstest.CheckBooks(t, h.pool, acc)
	if n := h.countAudit(t, `action = 'payments.inquire' AND outcome = 'ok' AND target_id = $1`, op.String()); n != 2 {
		t.Errorf("%d inquire audit rows, want 2", n)
	}
	if n := h.countAudit(t, `action = 'payments.inquire' AND target_id = $1 AND after->>'status' = 'completed' AND after->>'answer' = 'succeeded' AND before->>'status' = 'unknown'`, op.String()); n != 1 {
		t.Errorf("the resolving inquiry's audit row lacks its before/after (%d)", n)
	}
}

// Invariant 11 for inquire: the answer's resolution and its audit row are
// one transaction; if the audit row cannot be written, the payment stays
// unknown.
func TestInquireResolutionAndAuditAreOne(t *testing.T) {
	t.Parallel()
	sim := provider.NewSimulator(provider.SimConfig{})
	if err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	h := start(t, options{configure: func(c *web.Config) { c.ProviderURL = sim.URL() }})
	b, token := h.signedIn(t, "oncall")
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "21.00"})
	p, err := payments.Get(context.Background(), h.pool, op)
	if err != nil {
		t.Fatal(err)
	}
	// The provider did charge it: the inquiry's answer is definite.
	if _, err := provider.NewClient(sim.URL(), 5*time.Second).Charge(context.Background(), provider.ChargeRequest{OperationID: op, Amount: p.Amount, Currency: p.Currency}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(context.Background(), `
		CREATE FUNCTION test_refuse_inquire_audit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'planted failure'; END $$;
		CREATE TRIGGER test_refuse_inquire_audit BEFORE INSERT ON audit_event
		    FOR EACH ROW WHEN (NEW.outcome = 'ok' AND NEW.action = 'payments.inquire') EXECUTE FUNCTION test_refuse_inquire_audit();`); err != nil {
		t.Fatal(err)
	}
	if resp, _ := h.postForm(t, b, "/payments/"+op.String()+"/inquire", url.Values{"csrf_token": {token}}); resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("inquire with a failing audit: %d, want 500", resp.StatusCode)
	}
	if e := h.effectsOf(t, op); e.status != "unknown" || e.ledger != 0 || e.completed != 0 {
		t.Fatalf("the resolution committed without its audit row: %+v", e)
	}
	if n := h.countAudit(t, `action = 'payments.inquire' AND outcome = 'ok' AND target_id = $1`, op.String()); n != 0 {
		t.Fatalf("%d ok audit rows", n)
	}
}

// A settlement file cannot move an amount above the four-eyes threshold on
// one operator's word (a reviewer hand-wrote a one-line file and completed
// a 413.37 payment with no second approval): its line becomes a request on
// Approvals, audited as the uploader's, and a second operator's approval
// resolves it with the line's provider reference. Lines below the
// threshold apply at once, as before.
func TestSettlementAboveTheThresholdWaitsForASecondOperator(t *testing.T) {
	t.Parallel()
	h := start(t, options{configure: func(c *web.Config) { c.FourEyesAbove = decimal.RequireFromString("100.00") }})
	small, acc := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "50.00"})
	big, accBig := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "413.37"})
	admin, adminToken := h.signedIn(t, "admin")

	_, page := admin.get(t, h.base+"/payments/settlements", "text/html")
	if note := doc(t, page).Find(`[data-testid="settlement-four-eyes"]`).Text(); !strings.Contains(note, "100.00") {
		t.Fatalf("the page does not say what the threshold does: %q", note)
	}
	file := small.String() + ",succeeded,ref-small\n" + big.String() + ",succeeded,ch_9\n"
	resp, body := h.upload(t, admin, adminToken, file)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload: %d", resp.StatusCode)
	}
	dry := map[string]string{}
	d := doc(t, body)
	d.Find(`[data-testid="diff-row"]`).Each(func(i int, s *goquery.Selection) { dry[s.AttrOr("data-result", "")] = s.Text() })
	if !strings.Contains(dry[payments.LineResolved], "would resolve") || !strings.Contains(dry[payments.LineAwaiting], "second operator") {
		t.Fatalf("dry run: %v", dry)
	}
	sha := d.Find(`input[name="confirm_sha256"]`).AttrOr("value", "")
	resp, body = h.confirm(t, admin, adminToken, sha)
	if resp.StatusCode != http.StatusOK || !strings.Contains(doc(t, body).Find(`[data-testid="notice"]`).Text(), "1 request above the four-eyes threshold") {
		t.Fatalf("apply: %d %q", resp.StatusCode, doc(t, body).Find(`[data-testid="notice"]`).Text())
	}
	if e := h.effectsOf(t, small); e.status != "completed" {
		t.Fatalf("the line below the threshold: %+v", e)
	}
	if e := h.effectsOf(t, big); e.status != "unknown" || e.ledger != 0 || e.reservation != "active" {
		t.Fatalf("the line above the threshold moved the payment: %+v", e)
	}
	if n := h.countAudit(t, `action = 'payments.resolve_request' AND outcome = 'ok' AND target_id = $1 AND actor_name = 'admin' AND evidence LIKE $2 AND reason LIKE '%says succeeded (line 2)'`,
		big.String(), "settlement sha256:"+sha+" line 2"); n != 1 {
		t.Fatalf("%d request audit rows naming the file's line and why, want 1", n)
	}

	// The uploader cannot approve it; a second operator can.
	_, list := admin.get(t, h.base+"/approvals", "text/html")
	if doc(t, list).Find(`[data-testid="own-request"]`).Length() != 1 || doc(t, list).Find(`[data-testid="approve"]`).Length() != 0 {
		t.Fatal("the uploader is offered their own file's request to approve")
	}
	oncall, oncallToken := h.signedIn(t, "oncall")
	_, list = oncall.get(t, h.base+"/approvals", "text/html")
	row := doc(t, list).Find(`[data-testid="approval-row"]`)
	if ev := row.Find(`[data-testid="approval-evidence"]`).Text(); !strings.Contains(ev, "ch_9") || strings.Count(ev, sha) != 1 {
		t.Fatalf("the request's evidence should name the line's reference and the file's hash once: %q", ev)
	}
	resp, _ = h.postForm(t, oncall, "/approvals/"+row.AttrOr("data-id", "")+"/approve", url.Values{"csrf_token": {oncallToken}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("approve: %d", resp.StatusCode)
	}
	if e := h.effectsOf(t, big); e.status != "completed" || e.ledger != 1 {
		t.Fatalf("after the approval: %+v", e)
	}
	var ref string
	if err := h.pool.QueryRow(context.Background(), `SELECT provider_ref FROM payment WHERE operation_id = $1`, big).Scan(&ref); err != nil || ref != "ch_9" {
		t.Fatalf("provider reference %q, want the line's (%v)", ref, err)
	}
	_, page = oncall.get(t, h.base+"/payments/"+big.String(), "text/html")
	if got := strings.Join(strings.Fields(doc(t, page).Find(`[data-testid="resolved-by"]`).Text()), " "); !strings.HasPrefix(got, "operator admin, approved by oncall") {
		t.Fatalf("resolved by %q", got)
	}
	paymentstest.CheckBooks(t, h.pool, acc)
	paymentstest.CheckBooks(t, h.pool, accBig)
}

// A file is applied by the operator who uploaded it and read its dry run:
// else the uploader could have a colleague confirm it by its hash alone, and
// then approve the four-eyes requests its lines became, as that colleague's
// (a security review did so). The refusal is audited; the uploader's own
// confirmation still applies it.
func TestSettlementIsAppliedOnlyByItsUploader(t *testing.T) {
	t.Parallel()
	h := start(t, options{configure: func(c *web.Config) { c.FourEyesAbove = decimal.RequireFromString("100.00") }})
	big, acc := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "300.00"})
	oncall, oncallToken := h.signedIn(t, "oncall")
	admin, adminToken := h.signedIn(t, "admin")
	resp, body := h.upload(t, oncall, oncallToken, big.String()+",succeeded,ref-z\n")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload: %d", resp.StatusCode)
	}
	sha := doc(t, body).Find(`input[name="confirm_sha256"]`).AttrOr("value", "")
	resp, body = h.confirm(t, admin, adminToken, sha)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(doc(t, body).Find(`[data-testid="problem"]`).Text(), "You have not uploaded this file here in the last hour: upload it yourself") {
		t.Fatalf("another operator's confirmation: %d %q", resp.StatusCode, doc(t, body).Find(`[data-testid="problem"]`).Text())
	}
	var approvals int
	if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM payment_approval`).Scan(&approvals); err != nil || approvals != 0 {
		t.Fatalf("%d approval requests after a refused confirmation (%v), want 0", approvals, err)
	}
	if n := h.countAudit(t, `action = 'payments.settle' AND outcome = 'denied' AND error_code = 'not_uploader' AND actor_name = 'admin' AND evidence = $1 AND after = $2::jsonb`,
		"settlement sha256:"+sha, `{"uploaders": ["`+h.idp.Issuer()+`|demo-oncall"]}`); n != 1 {
		t.Fatalf("%d audit rows of the refusal naming the uploader, want 1", n)
	}
	if resp, _ = h.confirm(t, oncall, oncallToken, sha); resp.StatusCode != http.StatusOK {
		t.Fatalf("the uploader's confirmation: %d", resp.StatusCode)
	}
	if e := h.effectsOf(t, big); e.status != "unknown" || e.reservation != "active" {
		t.Fatalf("a line above the threshold moved the payment: %+v", e)
	}
	paymentstest.CheckBooks(t, h.pool, acc)
}

// Every operator who uploaded a file within the hour read its dry run and
// may apply it: a second operator uploading the same file to check it no
// longer took it from the first (a drill; the first was refused, told
// another operator had uploaded it). The file is applied once: the second
// confirmation finds its lines applied and changes nothing. An operator who
// did not upload it is refused, told so truly, and the refusal's audit row
// names who did. Past the hour the file is gone, and uploading it again
// starts a fresh set of uploaders.
func TestSettlementMayBeAppliedByEachOfItsUploaders(t *testing.T) {
	t.Parallel()
	h := start(t, options{configure: func(c *web.Config) { c.FourEyesAbove = decimal.RequireFromString("100.00") }})
	small, acc := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "50.00"})
	big, accBig := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "300.00"})
	h.idp.AddUser("oncall2", "oncall2", "oncall")
	oncall, oncallToken := h.signedIn(t, "oncall")
	admin, adminToken := h.signedIn(t, "admin")
	third, thirdToken := h.signedIn(t, "oncall2")
	iss := h.idp.Issuer()
	file := small.String() + ",succeeded,ref-s\n" + big.String() + ",succeeded,ref-b\n"

	var sha string
	for _, b := range []struct {
		br    *browser
		token string
	}{{oncall, oncallToken}, {admin, adminToken}} {
		resp, body := h.upload(t, b.br, b.token, file)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("upload: %d", resp.StatusCode)
		}
		d := doc(t, body)
		sha = d.Find(`input[name="confirm_sha256"]`).AttrOr("value", "")
		if who := d.Find(`[data-testid="confirm-who"]`).Text(); !strings.Contains(who, "for an hour, by whoever uploaded the file") {
			t.Fatalf("the dry run does not say who may confirm it, and until when: %q", who)
		}
		words := map[string]string{}
		d.Find(`[data-testid="diff-row"]`).Each(func(_ int, s *goquery.Selection) {
			words[s.AttrOr("data-result", "")] = s.Find(`[data-testid="diff-result"]`).Text()
		})
		if words[payments.LineResolved] != "settles" || words[payments.LineAwaiting] != "awaits a second operator" {
			t.Fatalf("the dry run's results read %q, want words", words)
		}
	}

	// A third operator, who did not upload it, is refused: nothing applied.
	resp, body := h.confirm(t, third, thirdToken, sha)
	if p := doc(t, body).Find(`[data-testid="problem"]`).Text(); resp.StatusCode != http.StatusForbidden ||
		!strings.Contains(p, "You have not uploaded this file here in the last hour: upload it yourself to read its dry run, then confirm.") {
		t.Fatalf("a confirmation by an operator who did not upload the file: %d %q", resp.StatusCode, p)
	}
	if e := h.effectsOf(t, small); e.status != "unknown" {
		t.Fatalf("a refused confirmation moved a payment: %+v", e)
	}
	if n := h.countAudit(t, `action = 'payments.settle' AND outcome = 'denied' AND error_code = 'not_uploader' AND actor_sub = 'user-oncall2' AND evidence = $1 AND after = $2::jsonb`,
		"settlement sha256:"+sha, `{"uploaders": ["`+iss+`|demo-oncall", "`+iss+`|demo-admin"]}`); n != 1 {
		t.Fatalf("%d audit rows of the refusal naming both uploaders, want 1", n)
	}

	// The first uploader applies it, and is the requester of the line
	// above the threshold.
	resp, body = h.confirm(t, oncall, oncallToken, sha)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the first uploader's confirmation: %d %q", resp.StatusCode, doc(t, body).Find(`[data-testid="problem"]`).Text())
	}
	if got := doc(t, body).Find(`[data-testid="diff-row"][data-result="resolved"] [data-testid="diff-result"]`).Text(); got != "settled" {
		t.Errorf("an applied line reads %q, want settled", got)
	}
	var requester string
	if err := h.pool.QueryRow(context.Background(), `SELECT requested_by FROM payment_approval WHERE operation_id = $1 AND state = 'pending'`, big).Scan(&requester); err != nil || requester != iss+"|demo-oncall" {
		t.Fatalf("the request above the threshold was made by %q (%v), want the confirming operator", requester, err)
	}
	// The second uploader's confirmation is not refused, and finds it
	// applied: nothing moves twice, no second request, no second audit row.
	resp, body = h.confirm(t, admin, adminToken, sha)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the second uploader's confirmation: %d %q", resp.StatusCode, doc(t, body).Find(`[data-testid="problem"]`).Text())
	}
	if n := doc(t, body).Find(`[data-testid="diff-row"][data-result="agreed"]`).Length(); n != 1 {
		t.Errorf("the second confirmation shows %d lines already applied, want 1", n)
	}
	if e := h.effectsOf(t, small); e.status != "completed" || e.ledger != 1 {
		t.Fatalf("small after two confirmations: %+v", e)
	}
	if e := h.effectsOf(t, big); e.status != "unknown" || e.reservation != "active" {
		t.Fatalf("big after two confirmations: %+v", e)
	}
	if n := h.countAudit(t, `action = 'payments.settle' AND outcome = 'ok'`); n != 1 {
		t.Errorf("%d settle audit rows, want 1", n)
	}
	var requests int
	if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM payment_approval`).Scan(&requests); err != nil || requests != 1 {
		t.Fatalf("%d four-eyes requests (%v), want 1", requests, err)
	}
	// The requester cannot approve it; the other uploader can.
	_, list := oncall.get(t, h.base+"/approvals", "text/html")
	if doc(t, list).Find(`[data-testid="approve"]`).Length() != 0 {
		t.Fatal("the confirming uploader is offered their own request to approve")
	}
	_, list = admin.get(t, h.base+"/approvals", "text/html")
	row := doc(t, list).Find(`[data-testid="approval-row"]`)
	if resp, _ := h.postForm(t, admin, "/approvals/"+row.AttrOr("data-id", "")+"/approve", url.Values{"csrf_token": {adminToken}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("approve: %d", resp.StatusCode)
	}
	if e := h.effectsOf(t, big); e.status != "completed" || e.ledger != 1 {
		t.Fatalf("big after the approval: %+v", e)
	}
	paymentstest.CheckBooks(t, h.pool, acc)
	paymentstest.CheckBooks(t, h.pool, accBig)

	// Past the hour the file is gone; the third operator uploads it again
	// and is its one uploader: the earlier two must upload it again too.
	if _, err := h.pool.Exec(context.Background(), `UPDATE payment_settlement_upload SET uploaded_at = uploaded_at - interval '2 hours';
		UPDATE payment_settlement_uploader SET uploaded_at = uploaded_at - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	if resp, _ := h.confirm(t, oncall, oncallToken, sha); resp.StatusCode != http.StatusConflict {
		t.Fatalf("a confirmation past the hour: %d, want 409 (expired)", resp.StatusCode)
	}
	if resp, _ := h.upload(t, third, thirdToken, file); resp.StatusCode != http.StatusOK {
		t.Fatalf("upload again: %d", resp.StatusCode)
	}
	if resp, _ := h.confirm(t, oncall, oncallToken, sha); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("an uploader of the expired set confirming the fresh one: %d, want 403", resp.StatusCode)
	}
	if n := h.countAudit(t, `action = 'payments.settle' AND outcome = 'denied' AND actor_sub = 'demo-oncall' AND after = $1::jsonb`,
		`{"uploaders": ["`+iss+`|user-oncall2"]}`); n != 1 {
		t.Fatalf("%d refusals naming the fresh set's one uploader, want 1", n)
	}
	if resp, _ := h.confirm(t, third, thirdToken, sha); resp.StatusCode != http.StatusOK {
		t.Fatalf("the fresh set's uploader: %d", resp.StatusCode)
	}
}

// A four-eyes request waits for a second operator, who learns of it on the
// dashboard and in /metrics, not only by opening the Approvals page: both
// read the one snapshot.
func TestWaitingApprovalsShowOnTheDashboardAndInMetrics(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 50 * time.Millisecond, configure: func(c *web.Config) { c.FourEyesAbove = decimal.RequireFromString("100.00") }})
	oncall, token := h.signedIn(t, "oncall")
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "500.00"})
	if resp, _ := h.postForm(t, oncall, "/payments/"+op.String()+"/resolve", resolveForm(token, "succeeded")); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("request: %d", resp.StatusCode)
	}
	viewer, _ := h.signedIn(t, "support")
	testkit.Eventually(t, "the gauge", func() (bool, error) {
		_, body := viewer.get(t, h.base+"/metrics", "")
		return strings.Contains(body, "\nsluice_payments_approvals_pending 1\n"), nil
	})
	_, page := viewer.get(t, h.base+"/", "text/html")
	if got := strings.TrimSpace(doc(t, page).Find(`[data-testid="approvals-waiting"]`).Text()); got != "1" {
		t.Errorf("the dashboard's Approvals waiting reads %q, want 1", got)
	}
}
