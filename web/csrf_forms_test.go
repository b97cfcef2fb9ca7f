package web_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"
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

	pages := []string{"/", "/outbox", "/outbox?status=dead", "/outbox/" + dead.String(), "/outbox/" + sealed.String(),
		"/payments", "/payments/" + small.String(), "/payments/" + big.String(), "/payments/settlements", "/approvals",
		"/jobs", "/outbox/bulk", "/outbox?topic=orders", "/inbox", "/relays", "/audit", "/audit/1"}
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
