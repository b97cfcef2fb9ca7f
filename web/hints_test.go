package web_test

import (
	"strings"
	"testing"
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
