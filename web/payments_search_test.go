package web_test

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
	"github.com/sluice-dev/sluice/internal/pii"
	"github.com/sluice-dev/sluice/internal/testkit"
	"github.com/sluice-dev/sluice/web"
)

// Issue 11: support finds a customer's payments by exact email or tax id
// without seeing the customer; what they typed is neither shown back,
// logged in a URL nor audited in clear (the audit row keeps a keyed hash).
func TestSearchPaymentsByCustomerWithoutPlaintext(t *testing.T) {
	t.Parallel()
	kr := testKeyring(t, "k1")
	h := start(t, options{keyring: kr})
	acc := paymentstest.Account(t, h.pool, paymentstest.AccountOpts{ID: 41, Balance: "10000"})
	const taxID = "12345678901"
	pay := func(email, tax string) uuid.UUID {
		return paymentstest.Payment(t, h.pool, paymentstest.PaymentOpts{Account: acc, Amount: "5.00",
			EmailIndex: kr.BlindIndex(pii.FieldEmail, email), TaxIDIndex: kr.BlindIndex(pii.FieldTaxID, tax)})
	}
	a1, a2 := pay(canaryEmail, taxID), pay(canaryEmail, "99999999999")
	other := pay("someone.else@example.org", "11111111111")

	b, token := h.signedIn(t, "support")
	_, list := b.get(t, h.base+"/payments", "text/html")
	if doc(t, list).Find(`[data-testid="customer-search"]`).Length() != 1 {
		t.Fatal("support is offered no customer search")
	}
	search := func(field, typed string) ([]string, string) {
		t.Helper()
		resp, _ := b.postForm(t, h.base+"/payments/search", token, url.Values{"customer_field": {field}, "customer": {typed}})
		loc := resp.Header.Get("Location")
		if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/payments/search?q=") {
			t.Fatalf("search %s: %d to %q, want 303 to the results page", field, resp.StatusCode, loc)
		}
		if strings.Contains(strings.ToLower(loc), "zebulon") || strings.Contains(loc, "123") {
			t.Fatalf("the results page's address carries what was typed: %s", loc)
		}
		resp, body := b.get(t, h.base+loc, "text/html")
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Cache-Control") != "no-store" {
			t.Fatalf("search %s: %d, Cache-Control %q", field, resp.StatusCode, resp.Header.Get("Cache-Control"))
		}
		var ids []string
		doc(t, body).Find(`[data-testid="row"]`).Each(func(_ int, s *goquery.Selection) { ids = append(ids, s.AttrOr("data-id", "")) })
		slices.Sort(ids)
		return ids, body
	}
	want := []string{a1.String(), a2.String()}
	slices.Sort(want)
	typed := "  Zebulon.Quackenbush@CANARY.example "
	got, body := search("email", typed)
	if !slices.Equal(got, want) {
		t.Fatalf("email search found %v, want %v (not %s)", got, want, other)
	}
	if strings.Contains(strings.ToLower(body), "zebulon") {
		t.Error("the results page shows what was typed")
	}
	if got, _ := search("tax_id", "123 456-789 01"); !slices.Equal(got, []string{a1.String()}) {
		t.Fatalf("tax id search found %v, want %v", got, a1)
	}
	if got, _ := search("email", "zebulon.quackenbush@canary.exampl"); len(got) != 0 {
		t.Fatalf("a near miss found %v", got)
	}
	if n := h.countAudit(t, `action = 'payments.search' AND target_type = 'customer' AND target_id = $1`, kr.SearchHash(pii.FieldEmail, typed)); n != 1 {
		t.Fatalf("%d audit rows with the keyed hash of the email search, want 1", n)
	}
	if n := h.countAudit(t, `row_to_json(audit_event)::text ILIKE '%zebulon%' OR row_to_json(audit_event)::text LIKE '%12345678901%'`); n != 0 {
		t.Fatalf("%d audit rows carry the typed value in clear", n)
	}
}

// An exact match answers whether a guess is right, and the masks give part
// of each value away: searches are limited per user, and the refusals
// audited, so a viewer cannot confirm the masked rest by trying candidates
// (a security review ran 40 in a row).
func TestCustomerSearchesAreLimitedPerUser(t *testing.T) {
	t.Parallel()
	kr := testKeyring(t, "k1")
	h := start(t, options{keyring: kr})
	b, token := h.signedIn(t, "support")
	search := func(b *browser, token string) int {
		resp, _ := b.postForm(t, h.base+"/payments/search", token, url.Values{"customer_field": {"tax_id"}, "customer": {"12345678901"}})
		if resp.StatusCode != http.StatusSeeOther {
			return resp.StatusCode
		}
		resp, _ = b.get(t, h.base+resp.Header.Get("Location"), "text/html")
		return resp.StatusCode
	}
	for i := 0; i < web.SearchesPerMinute; i++ {
		if code := search(b, token); code != http.StatusOK {
			t.Fatalf("search %d: %d", i+1, code)
		}
	}
	if code := search(b, token); code != http.StatusTooManyRequests {
		t.Fatalf("search %d in a minute: %d, want 429", web.SearchesPerMinute+1, code)
	}
	if n := h.countAudit(t, `action = 'payments.search' AND outcome = 'denied' AND error_code = 'rate_limited'`); n != 1 {
		t.Fatalf("%d audited refusals, want 1", n)
	}
	// The request metric counts the answer given, 429, not a 500.
	if _, m := b.get(t, h.base+"/metrics", ""); !strings.Contains(m, `sluice_http_request_duration_seconds_count{code="429",method="POST",route="/payments/search"} 1`) {
		t.Errorf("the refused search is not counted as a 429:\n%s", grepLines(m, "/payments/search"))
	}
	other, otherToken := h.signedIn(t, "oncall")
	if code := search(other, otherToken); code != http.StatusOK {
		t.Fatalf("another user's search: %d", code)
	}
}

// The results page is a GET of its own address, so Back and reload read it
// (a POST's answer made the browser offer to send the form again). The
// search is audited and counted once, when typed: reading its page again
// is not a new search (a review burnt the limit with Back). Its address
// carries the terms sealed for the user, so it reads in their next sign-in
// and is no use to another user; a changed one is refused, and one older
// than SearchResultsFor says to search again.
func TestCustomerSearchResultsHaveAnAddressOfTheirSession(t *testing.T) {
	t.Parallel()
	kr := testKeyring(t, "k1")
	clock := testkit.NewClock(time.Now())
	h := start(t, options{keyring: kr, clock: clock.Now, configure: func(c *web.Config) { c.SessionIdle = 2 * time.Hour }})
	acc := paymentstest.Account(t, h.pool, paymentstest.AccountOpts{ID: 42, Balance: "1000"})
	op := paymentstest.Payment(t, h.pool, paymentstest.PaymentOpts{Account: acc, Amount: "5.00", EmailIndex: kr.BlindIndex(pii.FieldEmail, canaryEmail)})
	b, token := h.signedIn(t, "support")
	resp, _ := b.postForm(t, h.base+"/payments/search", token, url.Values{"customer_field": {"email"}, "customer": {canaryEmail}})
	loc := resp.Header.Get("Location")
	for i := range web.SearchesPerMinute + 5 { // the page, then Back and reloads, more than the limit
		resp, body := b.get(t, h.base+loc, "text/html")
		if resp.StatusCode != http.StatusOK || doc(t, body).Find(`[data-testid="row"][data-id="`+op.String()+`"]`).Length() != 1 {
			t.Fatalf("load %d of the results: %d", i+1, resp.StatusCode)
		}
	}
	if n := h.countAudit(t, `action = 'payments.search'`); n != 1 {
		t.Fatalf("%d audited searches, want 1: reading the results again is no new search", n)
	}
	// The same user signed in again (acting on money asks for it every
	// 15 minutes) reads them still; another user does not.
	again, _ := h.signedIn(t, "support")
	if resp, body := again.get(t, h.base+loc, "text/html"); resp.StatusCode != http.StatusOK || doc(t, body).Find(`[data-testid="row"][data-id="`+op.String()+`"]`).Length() != 1 {
		t.Fatalf("the same user's next sign-in: %d", resp.StatusCode)
	}
	other, _ := h.signedIn(t, "oncall")
	tampered := loc[:len(loc)-3] + "AAA"
	for name, c := range map[string]struct {
		b   *browser
		loc string
	}{"another user": {other, loc}, "changed": {b, tampered}, "none": {b, "/payments/search"}} {
		resp, body := c.b.get(t, h.base+c.loc, "text/html")
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "Search again") {
			t.Errorf("%s: %d, want 400 saying to search again", name, resp.StatusCode)
		}
	}
	clock.Advance(web.SearchResultsFor + time.Minute)
	if resp, body := b.get(t, h.base+loc, "text/html"); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "Search again") {
		t.Errorf("results of a search made long ago: %d, want 400 saying to search again", resp.StatusCode)
	}
	if n := h.countAudit(t, `action = 'payments.search'`); n != 1 {
		t.Fatalf("%d audited searches after refused addresses, want still 1", n)
	}
}
