package web_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"unicode"

	"github.com/sluice-dev/sluice/internal/outbox/outboxtest"
	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
)

// A filter field with a rule of its own says it next to the field, linked
// to the input for screen readers, before anything is sent: the outbox's
// error search needs a bound (else a 400), the payments' invoice filter is
// exact (the customer search ignores case; invoice ids do not).
func TestFilterFieldsSayTheirRulesBeforeASubmit(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b, _ := h.signedIn(t, "support")
	for _, c := range []struct{ page, input, want string }{
		{"/outbox", `input[name="error_text"]`, "Error contains needs a status other than published, an aggregate id, or a created range of at most 1 hour."},
		{"/payments", `input[name="invoice_id"]`, "Invoice takes the exact invoice id, as the merchant sent it: capitals count."},
	} {
		resp, body := b.get(t, h.base+c.page, "text/html")
		d := doc(t, body)
		id := d.Find(c.input).AttrOr("aria-describedby", "")
		if resp.StatusCode != 200 || id == "" {
			t.Errorf("%s: %d, %s describes nothing", c.page, resp.StatusCode, c.input)
			continue
		}
		if got := squashed(d.Find("#" + id)); got != c.want {
			t.Errorf("%s: hint %q, want %q", c.page, got, c.want)
		}
	}
	// The refusal the hint forewarns of is the one the list gives.
	resp, body := b.get(t, h.base+"/outbox?error_text=timeout", "text/html")
	if resp.StatusCode != 400 || !strings.Contains(doc(t, body).Find(`[data-testid="problem"]`).Text(), "needs a status other than published") {
		t.Errorf("error search alone: %d", resp.StatusCode)
	}
}

// A bulk form refused for a field says so at the field: marked invalid,
// described by its error and focused as the page opens; the line above the
// form is a sentence (it began "an aggregate id needs …").
func TestBulkFormErrorsSitAtTheirField(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b, token := h.signedIn(t, "oncall")
	resp, body := b.postForm(t, h.base+"/outbox/bulk", token, url.Values{"dry_run": {"1"}, "action": {"retry"}, "aggregate_id": {"order-7"}})
	d := doc(t, body)
	in := d.Find(`[data-testid="bulk-aggregate_id"]`)
	if resp.StatusCode != http.StatusUnprocessableEntity || in.AttrOr("aria-invalid", "") != "true" || in.AttrOr("autofocus", "no") == "no" {
		t.Fatalf("aggregate id without its type: %d, field marked %q, focused %v", resp.StatusCode, in.AttrOr("aria-invalid", ""), in.AttrOr("autofocus", "no") != "no")
	}
	if got := squashed(d.Find("#" + in.AttrOr("aria-describedby", "none"))); got != "an aggregate id needs its aggregate type: fill in Aggregate type too" {
		t.Errorf("the field's error %q", got)
	}
	if d.Find(`[aria-invalid]`).Length() != 1 || d.Find(`[autofocus]`).Length() != 1 {
		t.Errorf("%d fields marked, %d focused; want the aggregate id alone", d.Find(`[aria-invalid]`).Length(), d.Find(`[autofocus]`).Length())
	}
	// A refusal only the filter's rules know (a dead-letter of dead
	// events) is a sentence above the form.
	_, body = b.postForm(t, h.base+"/outbox/bulk", token, url.Values{"dry_run": {"1"}, "status": {"dead"}, "action": {"dead_letter"}, "reason": {"x"}})
	if got := squashed(doc(t, body).Find(`[data-testid="bulk-problem"]`)); got == "" || !unicode.IsUpper([]rune(got)[0]) || !strings.HasSuffix(got, ".") {
		t.Errorf("the problem line %q is not a sentence", got)
	}
}

// Each page's title tells it apart from its siblings in tabs and history:
// a list's filter, a record's short id (the end of a UUID: version 7 ids
// made together share their start).
func TestTitlesNameTheFilterOrTheRecord(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	ev := outboxtest.Insert(t, h.pool, outboxtest.Seed{Topic: "orders"})[0].String()
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{})
	seedDeadEvents(t, h, "sluice.titles", 1)
	b, token := h.signedIn(t, "oncall")
	job := h.confirmBulk(t, b, token, url.Values{"topic": {"sluice.titles"}, "action": {"retry"}}).String()
	for path, want := range map[string]string{
		"/outbox?status=dead":      "Outbox: status dead · Sluice",
		"/outbox":                  "Outbox · Sluice",
		"/payments?status=unknown": "Payments: status unknown · Sluice",
		"/outbox/" + ev:            "Event …" + ev[len(ev)-12:] + " · Sluice",
		"/payments/" + op.String(): "Payment …" + op.String()[24:] + " · Sluice",
		"/jobs/" + job:             "Job …" + job[len(job)-12:] + " · Sluice",
	} {
		_, body := b.get(t, h.base+path, "text/html")
		if got := doc(t, body).Find("title").Text(); got != want {
			t.Errorf("%s: title %q, want %q", path, got, want)
		}
	}
}
