package web_test

import (
	"context"
	"net/http"
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
