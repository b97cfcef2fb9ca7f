package web_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
	"github.com/sluice-dev/sluice/web"
)

// The approvals page hears about a new four-eyes request without a reload
// and without polling: the feed pushes a signal when the pending requests
// change, and the page loads its list again.
func TestApprovalsPageHearsNewRequestsLive(t *testing.T) {
	h := start(t, options{tick: 100 * time.Millisecond, configure: func(c *web.Config) { c.FourEyesAbove = decimal.RequireFromString("100.00") }})
	ctx, _ := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	browserLogin(tctx, t, h, "admin")
	if err := chromedp.Do(tctx,
		chromedp.Navigate(h.base+"/approvals"),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="empty"]`)),
	); err != nil {
		t.Fatalf("open the approvals page: %v", err)
	}
	waitJS(tctx, t, "the approvals page is live", `document.getElementById('conn').dataset.state === 'open'`)

	// Another operator asks for a resolution above the threshold.
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "500.00"})
	b, token := h.signedIn(t, "oncall")
	if resp, _ := h.postForm(t, b, "/payments/"+op.String()+"/resolve", resolveForm(token, "succeeded")); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("resolve request: %d", resp.StatusCode)
	}
	waitJS(tctx, t, "the new request on the open page", `document.querySelector('[data-testid="approval-row"] a[href="/payments/`+op.String()+`"]') !== null`)
}

// Issue 10's browser test: an operator resolves an unknown payment above the
// threshold; nothing moves until a second operator approves it in another
// browser; the dashboard's unknown count drops live in a third browser
// signed in as support; the auditor finds the steps.
func TestBrowserFourEyesResolution(t *testing.T) {
	h := start(t, options{tick: 100 * time.Millisecond, configure: func(c *web.Config) { c.FourEyesAbove = decimal.RequireFromString("100.00") }})
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "500.00"})
	browser := func(user string) context.Context {
		ctx, _ := newChrome(t)
		tctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		t.Cleanup(cancel)
		browserLogin(tctx, t, h, user)
		return tctx
	}
	support := browser("support")
	if err := chromedp.Do(support, chromedp.Navigate(h.base+"/")); err != nil {
		t.Fatal(err)
	}
	waitJS(support, t, "support's dashboard counts one unknown payment", `document.querySelector('[data-testid="unknown"]').textContent.trim() === '1'`)

	oncall := browser("oncall")
	if err := chromedp.Do(oncall,
		chromedp.Navigate(h.base+"/payments/"+op.String()),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="four-eyes-note"]`)),
		chromedp.Click(chromedp.CSS(`[data-testid="outcome-succeeded"]`)),
		chromedp.SendKeys(chromedp.CSS(`[data-testid="reason"]`), "provider confirmed the charge by phone"),
		chromedp.SendKeys(chromedp.CSS(`[data-testid="evidence"]`), "ticket PRV-77"),
		chromedp.Click(chromedp.CSS(`[data-testid="action-resolve"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="notice"]`)),
	); err != nil {
		t.Fatalf("request the resolution: %v", err)
	}
	if e := h.effectsOf(t, op); e.status != "unknown" {
		t.Fatalf("a request above the threshold moved the payment: %+v", e)
	}

	admin := browser("admin")
	if err := chromedp.Do(admin,
		chromedp.Navigate(h.base+"/approvals"),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="approve"]`)),
		clickLiveUntil(`[data-testid="approve"]`, `[data-testid="notice"]`),
	); err != nil {
		t.Fatalf("approve: %v", err)
	}
	waitJS(support, t, "support's dashboard drops to no unknown payment, live", `document.querySelector('[data-testid="unknown"]').textContent.trim() === '0'`)
	if e := h.effectsOf(t, op); e.status != "completed" {
		t.Fatalf("after the approval: %+v", e)
	}
	for _, action := range []string{"payments.resolve_request", "payments.approve"} {
		if n := h.countAudit(t, `action = $1 AND outcome = 'ok' AND target_id = $2`, action, op.String()); n != 1 {
			t.Errorf("%d %s audit rows, want 1", n, action)
		}
	}

	// The auditor finds the steps on the payment's history, opens one, and
	// exports the filtered list.
	auditor := browser("auditor")
	if err := chromedp.Do(auditor,
		chromedp.Navigate(h.base+"/audit?target_type=payment&target_id="+op.String()),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="row-link"]`)),
	); err != nil {
		t.Fatalf("the payment's audit history: %v", err)
	}
	actions, err := chromedp.Run(auditor, chromedp.Evaluate[string](`Array.from(document.querySelectorAll('[data-testid="row"]')).map(r => r.textContent).join('|')`))
	if err != nil || !strings.Contains(actions, "payments.resolve_request") || !strings.Contains(actions, "payments.approve") {
		t.Fatalf("the auditor's list of the payment's steps: %q %v", actions, err)
	}
	exported, err := chromedp.Run(auditor, chromedp.Evaluate[string](`fetch(document.querySelector('[data-testid="export-csv"]').href).then(r => r.text())`, chromedp.EvalAwaitPromise))
	if err != nil || !strings.Contains(exported, "payments.approve") || !strings.Contains(exported, op.String()) {
		t.Fatalf("the filtered export: %q %v", exported, err)
	}
	if err := chromedp.Do(auditor,
		chromedp.Click(chromedp.CSS(`[data-testid="row-link"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="hash"]`)),
	); err != nil {
		t.Fatalf("open a step: %v", err)
	}
}

// A page that connects gets the feed's current signal at once. When it
// names the requests the page already lists, the list is left as it is:
// reloading it then swapped the buttons under the operator's pointer, and a
// click landing in that instant did nothing (a CI hang in the four-eyes
// test). A real change still reloads it.
func TestApprovalsPageIsNotReloadedWhenNothingChanged(t *testing.T) {
	h := start(t, options{tick: 100 * time.Millisecond, configure: func(c *web.Config) { c.FourEyesAbove = decimal.RequireFromString("100.00") }})
	b, token := h.signedIn(t, "oncall")
	request := func() string {
		op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "500.00"})
		if resp, _ := h.postForm(t, b, "/payments/"+op.String()+"/resolve", resolveForm(token, "succeeded")); resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("resolve request: %d", resp.StatusCode)
		}
		return op.String()
	}
	first := request()
	// The feed's snapshot must count the request before the page opens, or
	// its first push is older than the page and rightly reloads it.
	deadline := time.Now().Add(30 * time.Second)
	for s, ok := h.app.Feed().Latest(); !ok || s.Approvals.Pending != 1; s, ok = h.app.Feed().Latest() {
		if time.Now().After(deadline) {
			t.Fatalf("the feed never counted the pending request: %+v", s.Approvals)
		}
		time.Sleep(50 * time.Millisecond)
	}

	ctx, _ := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	browserLogin(tctx, t, h, "admin")
	if err := chromedp.Do(tctx,
		chromedp.Navigate(h.base+"/approvals"),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="approve"]`)),
	); err != nil {
		t.Fatalf("open the approvals page: %v", err)
	}
	if ok, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`(window.listAtLoad = document.getElementById('pending-approvals')) !== null`)); err != nil || !ok {
		t.Fatalf("mark the list: %v %v", ok, err)
	}
	waitJS(tctx, t, "the connect-time signal is seen and left out",
		`document.getElementById('approvals-signal').dataset.liveUnchanged === document.getElementById('approvals-signal').dataset.liveKey`)
	reloads := `performance.getEntriesByType('resource').filter(e => e.initiatorType === 'xmlhttprequest' && new URL(e.name).pathname === '/approvals').length`
	same, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`document.getElementById('pending-approvals') === window.listAtLoad`))
	if err != nil || !same {
		t.Fatalf("the list was replaced although nothing changed (same node: %v, %v)", same, err)
	}
	if n, err := chromedp.Run(tctx, chromedp.Evaluate[int](reloads)); err != nil || n != 0 {
		t.Fatalf("%d reloads of the list although nothing changed (%v)", n, err)
	}
	if n, _ := chromedp.Run(tctx, chromedp.Evaluate[int](`document.querySelectorAll('[data-testid="approval-row"]').length`)); n != 1 {
		t.Fatalf("%d rows, want the one request (%s)", n, first)
	}

	// A second request changes the state: the list loads again and shows it.
	second := request()
	waitJS(tctx, t, "the second request on the open page", `document.querySelector('[data-testid="approval-row"] a[href="/payments/`+second+`"]') !== null`)
	if n, err := chromedp.Run(tctx, chromedp.Evaluate[int](reloads)); err != nil || n < 1 {
		t.Fatalf("the list showed the new request without a reload? %d reloads (%v)", n, err)
	}
}
