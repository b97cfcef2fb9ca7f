package web_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
	"github.com/sluice-dev/sluice/web"
)

// discrepancy plants a completed payment and a settlement file line saying
// it failed (as `console payments reconcile` applies it): the payment and
// its open discrepancy's id.
func (h *harness) discrepancy(t *testing.T) (uuid.UUID, int64) {
	t.Helper()
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Status: payments.StatusCompleted, Amount: "42.00"})
	var id int64
	_, err := payments.ApplySettlement(context.Background(), h.pool, strings.NewReader(op.String()+",failed,prv-77\n"), payments.SettlementOptions{
		Source: "eod.csv", Report: func(l payments.SettlementLine) { id = l.DiscrepancyID }})
	if err != nil || id == 0 {
		t.Fatalf("discrepancy of %s: %d %v", op, id, err)
	}
	return op, id
}

func closeForm(token, reason string) url.Values {
	return url.Values{"csrf_token": {token}, "expected": {"open"}, "reason": {reason}}
}

func closePath(id int64) string { return fmt.Sprintf("/payments/discrepancies/%d/close", id) }

// books is what closing must never change: the payment's status and
// update time, its reservation, the account and the ledger, the outbox.
func (h *harness) books(t *testing.T, op uuid.UUID) string {
	t.Helper()
	var s string
	if err := h.pool.QueryRow(context.Background(), `
		SELECT concat_ws(' ', p.status, p.updated_at, r.status, a.balance, a.reserved,
		       (SELECT count(*) FROM ledger_entry), (SELECT count(*) FROM outbox_event))
		  FROM payment p JOIN balance_reservation r USING (operation_id) JOIN account a ON a.account_id = p.account_id
		 WHERE p.operation_id = $1`, op).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func (h *harness) openDiscrepancies(t *testing.T) int {
	t.Helper()
	n, err := payments.CountOpenDiscrepancies(context.Background(), h.pool)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The discrepancies list, the dashboard's link to it and the close on the
// payment's page, role by role: support sees the list and the payment's
// open discrepancy but no form, and a close it posts anyway is refused
// (403, audited); so is one without the CSRF token, without a reason
// (422) or without the form's expected state (400); oncall closes it with
// a reason (one audit row naming the payment and the reason; the
// payment's status and books untouched), and a second close — its own,
// or admin's — is a 409 saying who closed it, audited as a conflict. The
// closed list shows who closed it and why.
func TestDiscrepancyListAndClose(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	op, id := h.discrepancy(t)
	support, supportToken := h.signedIn(t, "support")
	oncall, token := h.signedIn(t, "oncall")
	admin, adminToken := h.signedIn(t, "admin")
	auditor, _ := h.signedIn(t, "auditor")

	_, body := support.get(t, h.base+"/payments/discrepancies", "text/html")
	d := doc(t, body)
	rows := d.Find(`[data-testid="row"]`)
	if rows.Length() != 1 || rows.AttrOr("data-id", "") != fmt.Sprint(id) ||
		d.Find(`[data-testid="row-link"]`).AttrOr("href", "") != "/payments/"+op.String()+"#discrepancies" ||
		strings.TrimSpace(d.Find(`[data-testid="row-ours"]`).Text()) != "completed" || strings.TrimSpace(d.Find(`[data-testid="row-provider"]`).Text()) != "failed" ||
		!strings.Contains(d.Find(`[data-testid="row-evidence"]`).Text(), "settlement file") || !strings.Contains(d.Find(`[data-testid="row-evidence"]`).Text(), "prv-77") ||
		!strings.Contains(d.Find(`[data-testid="count"]`).Text(), "1 open discrepancy") {
		t.Fatalf("support's list: %s", strings.Join(strings.Fields(d.Find("main").Text()), " "))
	}
	if d.Find(`[data-testid="close-hint"]`).Length() != 0 || d.Find(`[data-testid="not-found-link"]`).Length() != 0 {
		t.Error("support's list offers a close or the audit trail")
	}
	_, body = auditor.get(t, h.base+"/payments/discrepancies", "text/html")
	if got := doc(t, body).Find(`[data-testid="not-found-link"]`).AttrOr("href", ""); got != "/audit?action=payments.settle_not_found" {
		t.Errorf("the auditor's link to the unmatched lines: %q", got)
	}
	for _, b := range []*browser{support, oncall} {
		_, body = b.get(t, h.base+"/", "text/html")
		if got := doc(t, body).Find(`a[data-testid="discrepancies"]`).AttrOr("href", ""); got != "/payments/discrepancies" {
			t.Errorf("the dashboard's discrepancies tile links %q", got)
		}
		_, body = b.get(t, h.base+"/payments", "text/html")
		if got := doc(t, body).Find(`[data-testid="discrepancies-link"]`).AttrOr("href", ""); got != "/payments/discrepancies" {
			t.Errorf("the payments list links the discrepancies as %q", got)
		}
	}
	_, body = support.get(t, h.base+"/payments/"+op.String(), "text/html")
	if d := doc(t, body); d.Find(`[data-testid="discrepancy-open"]`).Length() != 1 || d.Find(`[data-testid="form-close-discrepancy"]`).Length() != 0 {
		t.Fatalf("support's payment page: open %d, form %d", d.Find(`[data-testid="discrepancy-open"]`).Length(), d.Find(`[data-testid="form-close-discrepancy"]`).Length())
	}
	_, body = oncall.get(t, h.base+"/payments/"+op.String(), "text/html")
	if got := doc(t, body).Find(`[data-testid="form-close-discrepancy"]`).AttrOr("action", ""); got != closePath(id) {
		t.Fatalf("oncall's close form posts to %q", got)
	}

	before := h.books(t, op)
	for name, c := range map[string]struct {
		b    *browser
		form url.Values
		want int
	}{
		"support":       {support, closeForm(supportToken, "refunded"), http.StatusForbidden},
		"no CSRF token": {oncall, url.Values{"expected": {"open"}, "reason": {"refunded"}}, http.StatusForbidden},
		"no reason":     {oncall, closeForm(token, "  "), http.StatusUnprocessableEntity},
		"not our form":  {oncall, url.Values{"csrf_token": {token}, "reason": {"refunded"}}, http.StatusBadRequest},
	} {
		resp, body := h.postForm(t, c.b, closePath(id), c.form)
		if resp.StatusCode != c.want {
			t.Errorf("%s: %d, want %d", name, resp.StatusCode, c.want)
		}
		if name == "no reason" && doc(t, body).Find(`[data-testid="close-reason-error"]`).Length() != 1 {
			t.Errorf("no reason: the page does not say the reason is missing")
		}
	}
	if n := h.openDiscrepancies(t); n != 1 {
		t.Fatalf("a refused close closed it (%d open)", n)
	}
	if n := h.countAudit(t, `action = 'request.denied' AND error_code IN ('permission', 'csrf')`); n != 2 {
		t.Errorf("%d audited refusals (permission, csrf), want 2", n)
	}
	if n := h.countAudit(t, `action = 'payments.close_discrepancy' AND outcome = 'error' AND error_code IN ('invalid', 'bad_request') AND target_id = $1`, op.String()); n != 2 {
		t.Errorf("%d audited invalid closes, want 2", n)
	}

	resp, _ := h.postForm(t, oncall, closePath(id), closeForm(token, "refunded the customer, ticket R-9"))
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/payments/"+op.String()+"?done=discrepancy_closed#discrepancies" {
		t.Fatalf("close: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if after := h.books(t, op); after != before {
		t.Fatalf("closing changed the payment or its books:\n before %s\n after  %s", before, after)
	}
	if n := h.openDiscrepancies(t); n != 0 {
		t.Fatalf("%d open after the close", n)
	}
	if n := h.countAudit(t, `action = 'payments.close_discrepancy' AND outcome = 'ok' AND target_type = 'payment' AND target_id = $1
		AND reason = 'refunded the customer, ticket R-9' AND actor_name = 'oncall'
		AND before->>'discrepancy' = 'open' AND after->>'discrepancy' = 'closed' AND after->>'discrepancy_id' = $2 AND after->>'status' = 'completed'`,
		op.String(), fmt.Sprint(id)); n != 1 {
		t.Fatalf("%d ok audit rows of the close, want 1", n)
	}
	_, body = oncall.get(t, h.base+"/payments/"+op.String(), "text/html")
	if d := doc(t, body); d.Find(`[data-testid="form-close-discrepancy"]`).Length() != 0 ||
		d.Find(`[data-testid="discrepancy-resolution"]`).Text() != "refunded the customer, ticket R-9" {
		t.Fatalf("the payment's page after the close: %s", strings.Join(strings.Fields(d.Find(`[data-testid="discrepancies"]`).Text()), " "))
	}

	for name, c := range map[string]struct {
		b     *browser
		token string
		says  string
	}{
		"oncall again": {oncall, token, "You closed this discrepancy already"},
		"admin":        {admin, adminToken, "Another operator, oncall, closed this discrepancy already"},
	} {
		resp, body := h.postForm(t, c.b, closePath(id), closeForm(c.token, "provider corrected its file"))
		got := doc(t, body).Find(`[data-testid="conflict"]`).Text()
		if resp.StatusCode != http.StatusConflict || !strings.Contains(got, c.says) || !strings.Contains(got, "refunded the customer, ticket R-9") {
			t.Errorf("%s: %d %q, want 409 saying %q", name, resp.StatusCode, got, c.says)
		}
	}
	if n := h.countAudit(t, `action = 'payments.close_discrepancy' AND outcome = 'error' AND error_code = 'conflict' AND target_id = $1`, op.String()); n != 2 {
		t.Errorf("%d audited conflicts, want 2", n)
	}
	if after := h.books(t, op); after != before {
		t.Fatalf("a refused close changed the payment or its books:\n before %s\n after  %s", before, after)
	}

	_, body = support.get(t, h.base+"/payments/discrepancies", "text/html")
	if d := doc(t, body); d.Find(`[data-testid="row"]`).Length() != 0 || d.Find(`[data-testid="empty"]`).Length() != 1 {
		t.Errorf("the open list after the close has %d rows", d.Find(`[data-testid="row"]`).Length())
	}
	_, body = support.get(t, h.base+"/payments/discrepancies?state=closed", "text/html")
	d = doc(t, body)
	if d.Find(`[data-testid="row"]`).Length() != 1 || !strings.Contains(d.Find(`[data-testid="row-closed"]`).Text(), "by oncall") ||
		d.Find(`[data-testid="row-resolution"]`).Text() != "refunded the customer, ticket R-9" {
		t.Errorf("the closed list: %s", strings.Join(strings.Fields(d.Find("main").Text()), " "))
	}
	for _, bad := range []string{"?state=maybe", "?after=garbage", "?state=closed&after=" + strings.Repeat("A", 65)} {
		if resp, body := support.get(t, h.base+"/payments/discrepancies"+bad, "text/html"); resp.StatusCode != http.StatusBadRequest ||
			doc(t, body).Find(`[data-testid="problem"]`).Length() != 1 {
			t.Errorf("%s: %d, want 400 with the problem explained", bad, resp.StatusCode)
		}
	}
}

// Operators closing one discrepancy at once over HTTP: one 303, the rest
// 409, one ok audit row, and the payment untouched.
func TestConcurrentDiscrepancyClosesOverHTTP(t *testing.T) {
	t.Parallel()
	h := start(t, options{configure: func(c *web.Config) { c.LoginRate = 10_000 }})
	op, id := h.discrepancy(t)
	const n = 6
	type session struct {
		b     *browser
		token string
	}
	sessions := make([]session, n)
	for i := range sessions {
		h.idp.AddUser(fmt.Sprintf("closer%d", i), "pw", "oncall")
		b := newBrowser(t)
		h.login(t, b, fmt.Sprintf("closer%d", i), "pw", "")
		sessions[i] = session{b, h.csrf(t, b)}
	}
	before := h.books(t, op)
	codes := make([]int, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			resp, _ := h.postForm(t, sessions[i].b, closePath(id), closeForm(sessions[i].token, fmt.Sprintf("refund %d", i)))
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
	if got := h.countAudit(t, `action = 'payments.close_discrepancy' AND outcome = 'ok'`); got != 1 {
		t.Fatalf("%d ok audit rows, want 1", got)
	}
	if after := h.books(t, op); after != before {
		t.Fatalf("closing changed the payment or its books:\n before %s\n after  %s", before, after)
	}
}

// Closing a discrepancy needs a recent sign-in, as a resolve does: a stale
// one is sent to sign in again, back to the payment, audited, and the
// discrepancy stays open; the payment's page links the sign-in instead of
// the form.
func TestDiscrepancyCloseNeedsRecentLogin(t *testing.T) {
	t.Parallel()
	var offset atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	h := start(t, options{clock: clock, configure: func(c *web.Config) { c.RecentLogin = time.Minute }})
	op, id := h.discrepancy(t)
	b, token := h.signedIn(t, "oncall")
	offset.Store(int64(2 * time.Minute))
	resp, _ := h.postForm(t, b, closePath(id), closeForm(token, "refunded"))
	want := "/login?reauth=1&next=" + url.QueryEscape("/payments/"+op.String())
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != want {
		t.Fatalf("stale sign-in: %d %q, want 303 %q", resp.StatusCode, resp.Header.Get("Location"), want)
	}
	if n := h.openDiscrepancies(t); n != 1 {
		t.Fatal("a stale sign-in closed the discrepancy")
	}
	if n := h.countAudit(t, `action = 'request.denied' AND (reason = 'reauth' OR error_code = 'reauth')`); n != 1 {
		t.Errorf("%d audited refusals, want 1", n)
	}
	_, body := b.get(t, h.base+"/payments/"+op.String(), "text/html")
	if d := doc(t, body); d.Find(`[data-testid="discrepancy-reauth-link"]`).AttrOr("href", "") != want || d.Find(`[data-testid="form-close-discrepancy"]`).Length() != 0 {
		t.Errorf("the payment's page offers %d forms and the sign-in %q", d.Find(`[data-testid="form-close-discrepancy"]`).Length(),
			d.Find(`[data-testid="discrepancy-reauth-link"]`).AttrOr("href", ""))
	}
}

// The list pages by keyset, oldest first: every open discrepancy once
// across pages, and the next link carries the list's state.
func TestDiscrepancyListPages(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	const n = 53 // more than a page of 50
	want := map[string]bool{}
	for range n {
		_, id := h.discrepancy(t)
		want[fmt.Sprint(id)] = true
	}
	b, _ := h.signedIn(t, "support")
	seen, pages := map[string]bool{}, 0
	for next := "/payments/discrepancies"; next != ""; pages++ {
		if pages > 3 {
			t.Fatal("the pages never end")
		}
		resp, body := b.get(t, h.base+next, "text/html")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", next, resp.StatusCode)
		}
		d := doc(t, body)
		d.Find(`[data-testid="row"]`).Each(func(_ int, s *goquery.Selection) {
			id := s.AttrOr("data-id", "")
			if seen[id] {
				t.Errorf("discrepancy %s on two pages", id)
			}
			seen[id] = true
		})
		next = d.Find(`[data-testid="next"]`).AttrOr("href", "")
	}
	if pages != 2 || len(seen) != n {
		t.Fatalf("%d pages, %d rows, want 2 pages and %d rows", pages, len(seen), n)
	}
	for id := range want {
		if !seen[id] {
			t.Errorf("discrepancy %s never listed", id)
		}
	}
}
