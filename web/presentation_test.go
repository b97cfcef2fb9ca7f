package web_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"

	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/outbox/outboxtest"
	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
)

// squashed is a selection's text as a browser shows it: runs of
// whitespace made one space.
func squashed(s *goquery.Selection) string { return strings.Join(strings.Fields(s.Text()), " ") }

// A bulk retry without a status acts on dead events only, and every page
// that describes its filter says so: the dry run, its confirmation, the
// jobs list and the job's page.
func TestBulkFilterNamesTheStatusItsActionImplies(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	seedDeadEvents(t, h, "sluice.orders", 3)
	outboxtest.Insert(t, h.pool, outboxtest.Seed{N: 2, Topic: "sluice.orders"}) // pending: not the retry's
	b, token := h.signedIn(t, "oncall")
	form := url.Values{"topic": {"sluice.orders"}, "action": {"retry"}}
	dry := url.Values{"dry_run": {"1"}, "topic": form["topic"], "action": form["action"]}
	resp, body := b.postForm(t, h.base+"/outbox/bulk", token, dry)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("dry run: %d %s", resp.StatusCode, body)
	}
	const want = `dead events on topic "sluice.orders"`
	d := doc(t, body)
	if got := squashed(d.Find(`[data-testid="bulk-summary"]`)); got != "Retry 3 events: "+want+"." {
		t.Errorf("dry run says %q, want %q", got, "Retry 3 events: "+want+".")
	}
	if got := squashed(d.Find(`[data-testid="bulk-confirm"]`)); got != "Retry 3 "+want {
		t.Errorf("confirmation button %q, want %q", got, "Retry 3 "+want)
	}
	id := h.confirmBulk(t, b, token, form)
	waitJob(t, h, id, outbox.JobDone)
	_, body = b.get(t, h.base+"/jobs", "text/html")
	if got := squashed(doc(t, body).Find(`[data-testid="job-row"] td`).Eq(2)); got != want {
		t.Errorf("jobs list filter %q, want %q", got, want)
	}
	_, body = b.get(t, h.base+"/jobs/"+id.String(), "text/html")
	if got := squashed(doc(t, body).Find(`[data-testid="job-filter"]`)); got != want {
		t.Errorf("job page filter %q, want %q", got, want)
	}
	if strings.Contains(body, "any status") {
		t.Error("the job page still says any status")
	}
}

// The payments pages: the list filtered to one status says only how that
// list is ordered; the list and a payment's page say when they were read
// (they are not live); one invalid settlement line is "1 invalid line".
func TestPaymentPagesOrderAsOfAndSingular(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{})
	b, token := h.signedIn(t, "oncall")

	_, body := b.get(t, h.base+"/payments?status=unknown", "text/html")
	d := doc(t, body)
	if got := squashed(d.Find(`[data-testid="count"]`)); got != "1 payment: the longest unknown on top" {
		t.Errorf("the unknown list's heading %q, want %q", got, "1 payment: the longest unknown on top")
	}
	for _, u := range []string{"/payments", "/payments/" + op.String()} {
		_, body = b.get(t, h.base+u, "text/html")
		note := doc(t, body).Find(`[data-testid="as-of"]`)
		if got := squashed(note); !strings.HasPrefix(got, "as of ") || !strings.Contains(got, "· reload for") || note.Find(`time[data-local]`).Length() != 1 {
			t.Errorf("%s: as-of note %q, want \"as of <time> · reload for …\"", u, got)
		}
	}

	resp, body := h.upload(t, b, token, op.String()+",succeeded\nnot-a-uuid,failed\n")
	if got := squashed(doc(t, body).Find(`[data-testid="problem"] p`).First()); resp.StatusCode != http.StatusUnprocessableEntity ||
		!strings.HasPrefix(got, "1 invalid line: nothing was applied.") {
		t.Errorf("bad file: %d %q, want \"1 invalid line: nothing was applied. …\"", resp.StatusCode, got)
	}
}
