package web_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/payments/provider"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// A payment made through the real payments API by a traced client, whose
// outcome the provider left unknown and an operator resolved in the
// console; its events relayed through embedded NATS and applied by the
// reference consumer. From the payment's page, one click opens its trace,
// and a real browser shows every step in time order: the API request and
// its idempotency record, the payment, reservation, provider call and
// ledger rows, each event written and published, the consumer's inbox row
// and effect, the operator's resolution and its audit row, with the lag
// between steps and the caller's trace id. From there an event's own page
// and its trace are one click each.
func TestBrowserTraceOfAPayment(t *testing.T) {
	h := start(t, options{})
	flowing(t, h)
	api := newPaymentsAPI(t, h.pool)
	api.sim.Next(provider.BehaveTimeoutAfterCharge)
	first := api.postTraced(t, "trace-1", `{"invoice_id":"inv-trace","account_id":4242,"amount":"12.00","currency":"TRY","customer":{"name":"Ada Lovelace","email":"ada@example.com","tax_id":"12345678901"}}`,
		testTraceparent)
	if first.status != http.StatusAccepted {
		t.Fatalf("payment: %d %s, want 202 unknown", first.status, first.body)
	}
	op := uuid.MustParse(first.json(t)["operation_id"].(string))
	ob, token := h.signedIn(t, "oncall")
	if resp, _ := h.postForm(t, ob, "/payments/"+op.String()+"/resolve", resolveForm(token, "succeeded")); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("resolve: %d", resp.StatusCode)
	}
	var events int
	testkit.Eventually(t, "every event of the payment to be published and consumed", func() (bool, error) {
		var all, done int
		err := h.pool.QueryRow(context.Background(), `
			SELECT count(*), count(*) FILTER (WHERE status = 'published'
			         AND EXISTS (SELECT 1 FROM consume_effect x WHERE x.consumer = $2 AND x.event_id = e.id::text))
			  FROM outbox_event e WHERE aggregate_type = 'payment' AND aggregate_id = $1`, op.String(), traceConsumer).Scan(&all, &done)
		events = all
		return all >= 2 && done == all, err
	})

	ctx, console := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	browserLogin(tctx, t, h, "admin")
	if err := chromedp.Do(tctx,
		chromedp.Navigate(h.base+"/payments/"+op.String()),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="trace-link"]`)),
		chromedp.Click(chromedp.CSS(`[data-testid="trace-link"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="trace"]`)),
	); err != nil {
		t.Fatalf("open the trace from the payment: %v", err)
	}
	waitJS(tctx, t, "the payment's trace page", `location.pathname === '/trace/payment/`+op.String()+`'`)
	raw, err := chromedp.Run(tctx, chromedp.Evaluate[string](`JSON.stringify([...document.querySelectorAll('[data-testid="step"]')].map(r => ({
		kind: r.dataset.kind, at: r.dataset.at, title: r.querySelector('[data-testid="step-title"]').textContent,
		lag: r.querySelector('[data-testid="lag"]').textContent.trim(),
		link: (r.querySelector('[data-testid="step-link"]') || {}).getAttribute?.('href') || ''})))`))
	if err != nil {
		t.Fatal(err)
	}
	var shown []struct{ Kind, At, Title, Lag, Link string }
	if err := json.Unmarshal([]byte(raw), &shown); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	steps := make([]traceStep, len(shown))
	first_ := map[string]int{}
	for i, s := range shown {
		steps[i] = traceStep{kind: s.Kind, at: s.At, title: s.Title, link: s.Link}
		if _, ok := first_[s.Kind]; !ok {
			first_[s.Kind] = i
		}
		if i > 0 && s.Lag == "" {
			t.Errorf("step %d (%s) shows no lag", i+1, s.Title)
		}
	}
	assertTimeOrder(t, steps)
	counts := kindCounts(steps)
	for _, kind := range []string{"api", "idempotency", "payment", "reservation", "provider", "ledger", "event", "publish", "inbox", "effect", "operator", "audit"} {
		if counts[kind] == 0 {
			t.Errorf("no %s step in the trace: %v", kind, titles(steps))
		}
	}
	if counts["event"] != events || counts["publish"] != events || counts["inbox"] != events || counts["effect"] != events {
		t.Errorf("steps %v for %d events: want each written, published, received and applied once", counts, events)
	}
	if steps[0].kind != "api" {
		t.Errorf("the trace starts with %q, want the API request", steps[0].title)
	}
	// published_at is the relay's mark after the broker's ack, so the
	// consumer's inbox row may come before it: no order between those two.
	for _, order := range [][2]string{{"api", "payment"}, {"payment", "provider"}, {"event", "publish"}, {"event", "inbox"}, {"inbox", "effect"}, {"provider", "operator"}} {
		if first_[order[0]] > first_[order[1]] {
			t.Errorf("the first %s step comes after the first %s step: %v", order[0], order[1], titles(steps))
		}
	}
	if got := text(tctx, t, `[data-testid="trace-id"]`); got != testTraceID {
		t.Errorf("trace id %q, want the client's %s", got, testTraceID)
	}
	if body, err := chromedp.Run(tctx, chromedp.Evaluate[string](`document.body.innerText`)); err != nil || strings.Contains(body, "Ada Lovelace") || strings.Contains(body, "ada@example.com") {
		t.Errorf("the trace shows the customer in clear (%v)", err)
	}

	// The first event's page, then its own trace.
	eventLink := ""
	for _, s := range steps {
		if s.kind == "publish" {
			eventLink = s.link
			break
		}
	}
	if !strings.HasPrefix(eventLink, "/outbox/") {
		t.Fatalf("the publish step links to %q", eventLink)
	}
	if err := chromedp.Do(tctx,
		chromedp.Click(chromedp.CSS(`[data-kind="publish"] [data-testid="step-link"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="event-id"]`)),
		chromedp.Click(chromedp.CSS(`[data-testid="trace-link"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="aggregate-trace"]`)),
	); err != nil {
		t.Fatalf("from the trace to the event and its trace: %v", err)
	}
	waitJS(tctx, t, "the event's trace page", `location.pathname === '/trace/event/`+strings.TrimPrefix(eventLink, "/outbox/")+`'`)
	if p := console.problems(); len(p) > 0 {
		t.Errorf("browser console: %v", p)
	}
}

func titles(steps []traceStep) []string {
	var out []string
	for _, s := range steps {
		out = append(out, s.kind+": "+s.title)
	}
	return out
}
