package web_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
	"github.com/sluice-dev/sluice/web"
)

// Every form that posts from a console page carries the session's CSRF
// token: as a hidden csrf_token field when the browser submits it, through
// the body's hx-headers when htmx does. The customer search shipped
// without it (every search was refused as "no permission") while its test
// posted with a token of its own; this walks the pages as each role sees
// them, with something on each to act on, and checks the forms themselves.
func TestEveryPostFormCarriesTheCSRFToken(t *testing.T) {
	t.Parallel()
	h, pages := consoleWithSomethingOnEachPage(t)
	forms := 0
	for _, user := range []string{"support", "oncall", "auditor", "admin"} {
		b, token := h.signedIn(t, user)
		for _, page := range pages {
			resp, body := b.get(t, h.base+page, "text/html")
			if resp.StatusCode == http.StatusForbidden {
				continue // not this role's page
			}
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s %s: %d", user, page, resp.StatusCode)
			}
			d := doc(t, body)
			hxToken := strings.Contains(d.Find("body").AttrOr("hx-headers", ""), token)
			d.Find("form").Each(func(_ int, f *goquery.Selection) {
				if !strings.EqualFold(f.AttrOr("method", "get"), "post") {
					return
				}
				forms++
				what := user + " " + page + ": the form posting to " + f.AttrOr("action", "?")
				if _, htmx := f.Attr("hx-post"); htmx {
					if !hxToken {
						t.Errorf("%s is sent by htmx, but the page's hx-headers carry no CSRF token", what)
					}
					return
				}
				if got := f.Find(`input[type="hidden"][name="csrf_token"]`).AttrOr("value", ""); got != token {
					t.Errorf("%s carries csrf_token %q, want the session's", what, got)
				}
			})
		}
	}
	// The walk saw the forms it is about (sign-out on every page, retry,
	// resolve, approve, search, settlements, bulk, pause, reveal, verify).
	if forms < 40 {
		t.Fatalf("only %d posting forms seen: the pages did not render what this test walks", forms)
	}
}

// consoleWithSomethingOnEachPage starts a console with something to act on
// on each page (a dead event, a sealed payment event, unknown payments
// below and above the four-eyes threshold, a pending request, dead events
// of a topic, an open and a closed discrepancy) and returns the pages to
// walk.
func consoleWithSomethingOnEachPage(t *testing.T) (*harness, []string) {
	t.Helper()
	kr := testKeyring(t, "k1")
	h := start(t, options{keyring: kr, configure: func(c *web.Config) { c.FourEyesAbove = decimal.RequireFromString("100.00") }})
	dead := plant(t, h, planted{status: "dead", attempts: 5, lastError: "refused"})
	sealed := sealedPaymentEvent(t, h, kr)
	small, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "50.00"})
	big, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "500.00"})
	oncall, oncallToken := h.signedIn(t, "oncall")
	if resp, _ := h.postForm(t, oncall, "/payments/"+big.String()+"/resolve", resolveForm(oncallToken, "succeeded")); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("a four-eyes request to approve: %d", resp.StatusCode)
	}
	seedDeadEvents(t, h, "orders", 3)
	// A discrepancy open (its close form) and one closed (the closed list).
	disputed, _ := h.discrepancy(t)
	closedOp, closedID := h.discrepancy(t)
	if resp, _ := h.postForm(t, oncall, fmt.Sprintf("/payments/discrepancies/%d/close", closedID), closeForm(oncallToken, "refunded")); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("a closed discrepancy: %d", resp.StatusCode)
	}
	return h, []string{"/", "/outbox", "/outbox?status=dead", "/outbox/" + dead.String(), "/outbox/" + sealed.String(),
		"/payments", "/payments/" + small.String(), "/payments/" + big.String(), "/payments/settlements", "/approvals",
		"/jobs", "/outbox/bulk", "/outbox?topic=orders", "/inbox", "/relays", "/audit", "/audit/1",
		"/trace/payment/" + big.String(), "/trace/event/" + dead.String(), "/outbox/bulk?status=dead&topic=orders&action=retry",
		"/payments/discrepancies", "/payments/discrepancies?state=closed", "/payments/" + disputed.String(), "/payments/" + closedOp.String()}
}

// No state change on GET (SECURITY.md): every page, as every role, leaves
// the outbox, the payments, the books, the requests, the discrepancies and
// the jobs as they were, and writes no audit row but the refusals of pages a role may not
// open. (GET /audit/export is the one GET that writes a row, its own
// audit.export, by design: who exported the trail is itself audited.)
func TestGetPagesChangeNothing(t *testing.T) {
	t.Parallel()
	h, pages := consoleWithSomethingOnEachPage(t)
	digest := func() string {
		t.Helper()
		var s string
		if err := h.pool.QueryRow(context.Background(), `SELECT concat_ws('|',
			(SELECT md5(coalesce(string_agg(concat_ws(',', id, status, attempts, available_at, locked_until, dead_at, published_at), ';' ORDER BY id), '')) FROM outbox_event),
			(SELECT md5(coalesce(string_agg(concat_ws(',', operation_id, status, updated_at, resolved_by), ';' ORDER BY operation_id), '')) FROM payment),
			(SELECT md5(coalesce(string_agg(concat_ws(',', account_id, balance, reserved, updated_at), ';' ORDER BY account_id), '')) FROM account),
			(SELECT count(*) FROM ledger_entry), (SELECT count(*) FROM balance_reservation WHERE status = 'active'),
			(SELECT md5(coalesce(string_agg(concat_ws(',', id, state), ';' ORDER BY id), '')) FROM payment_approval),
			(SELECT md5(coalesce(string_agg(concat_ws(',', discrepancy_id, resolved_at, resolved_by, resolution), ';' ORDER BY discrepancy_id), '')) FROM payment_discrepancy),
			(SELECT count(*) FROM outbox_job), (SELECT count(*) FROM outbox_topic_pause),
			(SELECT md5(coalesce(string_agg(concat_ws(',', operation_id, status), ';' ORDER BY operation_id), '')) FROM idempotency_record))`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	browsers := map[string]*browser{}
	for _, user := range []string{"support", "oncall", "auditor", "admin"} {
		browsers[user], _ = h.signedIn(t, user)
	}
	var seq int64 // the audit trail after the sign-ins
	if err := h.pool.QueryRow(context.Background(), `SELECT coalesce(max(seq), 0) FROM audit_event`).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	before := digest()
	seen := 0
	for user, b := range browsers {
		for _, page := range pages {
			resp, _ := b.get(t, h.base+page, "text/html")
			switch resp.StatusCode {
			case http.StatusOK:
				seen++
			case http.StatusForbidden:
			default:
				t.Errorf("%s GET %s: %d", user, page, resp.StatusCode)
			}
		}
	}
	if seen < 3*len(pages) {
		t.Fatalf("only %d pages answered 200: the walk did not render what it is about", seen)
	}
	if after := digest(); after != before {
		t.Errorf("GET pages changed the state:\n before %s\n after  %s", before, after)
	}
	rows, err := h.pool.Query(context.Background(), `SELECT action || ' ' || outcome FROM audit_event WHERE seq > $1 AND action <> 'request.denied'`, seq)
	if err != nil {
		t.Fatal(err)
	}
	written, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(written) > 0 {
		t.Errorf("GET pages wrote audit rows other than refusals: %v", written)
	}
}

// A form refused for its CSRF token says so, not that the user lacks a
// permission they have (the customer search's refusal read "You do not
// have permission to do this", and support had it).
func TestACSRFRefusalSaysWhy(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b, _ := h.signedIn(t, "support")
	resp, body := h.postForm(t, b, "/payments/search", url.Values{"customer_field": {"email"}, "customer": {"a@example.org"}})
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a search without the token: %d, want 403", resp.StatusCode)
	}
	text := doc(t, body).Find("main").Text()
	if !strings.Contains(text, "security token") || !strings.Contains(text, "Reload the page") || strings.Contains(text, "permission") {
		t.Fatalf("the refusal page reads %q; want it to name the missing token and what to do", strings.Join(strings.Fields(text), " "))
	}
	if n := h.countAudit(t, `action = 'request.denied' AND error_code = 'csrf'`); n != 1 {
		t.Fatalf("%d audited csrf refusals, want 1", n)
	}
}
