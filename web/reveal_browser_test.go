package web_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
)

// A refused reveal says why in the page, where the value would have been:
// htmx leaves error answers out of the page, so a reason of spaces looked
// like nothing happened, and after an earlier reveal the old value stayed
// on screen as if this one had worked.
func TestBrowserARefusedRevealSaysWhy(t *testing.T) {
	kr := testKeyring(t, "k1")
	h := start(t, options{keyring: kr})
	op := uuid.Must(uuid.NewV7())
	email, err := kr.Seal(payments.CustomerPlace(op), "email", canaryEmail)
	if err != nil {
		t.Fatal(err)
	}
	acc := paymentstest.Account(t, h.pool, paymentstest.AccountOpts{ID: 32, Balance: "1000"})
	paymentstest.Payment(t, h.pool, paymentstest.PaymentOpts{Account: acc, Amount: "20.00", OperationID: op, Customer: map[string]string{"email": email}})
	ctx, console := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	browserLogin(tctx, t, h, "oncall")
	form := `[data-testid="reveal-form"]:has(input[name="field"][value="email"])`
	if err := chromedp.Do(tctx, chromedp.Navigate(h.base+"/payments/"+op.String()),
		chromedp.SendKeys(chromedp.CSS(form+` [data-testid="reveal-reason"]`), "chargeback dispute 77"),
		chromedp.Click(chromedp.CSS(form+` button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(form+` [data-testid="revealed"]`))); err != nil {
		t.Fatal(err)
	}
	if got := text(tctx, t, form+` [data-testid="revealed"] code`); got != canaryEmail {
		t.Fatalf("revealed %q, want the email", got)
	}
	if err := chromedp.Do(tctx, chromedp.SetValue(chromedp.CSS(form+` [data-testid="reveal-reason"]`), "   "),
		chromedp.Click(chromedp.CSS(form+` button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(form+` [data-testid="reveal-problem"]`))); err != nil {
		t.Fatalf("a reveal without a reason showed no refusal: %v", err)
	}
	if got := text(tctx, t, form+` [data-testid="reveal-problem"]`); !strings.Contains(got, "needs a reason") {
		t.Errorf("the refusal reads %q, want why", got)
	}
	gone, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`document.querySelector('`+form+` [data-testid="revealed"]') === null`))
	if err != nil {
		t.Fatal(err)
	}
	if !gone {
		t.Error("the value revealed before is still on screen beside the refusal")
	}
	if p := console.problems(); len(p) > 0 {
		t.Logf("browser console: %q", p) // the refused request's 403 is logged by the browser itself
	}
}

// The resolve form's outcomes read one per line, at a desktop's width and
// a phone's: side by side, "…finalize and debit) ○ failed (…" read as one
// sentence on a form that moves money.
func TestBrowserResolveOutcomesReadOnePerLine(t *testing.T) {
	h := start(t, options{})
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "20.00"})
	ctx, _ := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	browserLogin(tctx, t, h, "oncall")
	for _, width := range []int64{1280, 400} {
		if err := chromedp.Do(tctx, chromedp.EmulateViewport(width, 900), chromedp.Navigate(h.base+"/payments/"+op.String()),
			chromedp.WaitVisible(chromedp.CSS(`[data-testid="outcome-choices"]`))); err != nil {
			t.Fatal(err)
		}
		apart, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`(function(){
			var s = document.querySelector('[data-testid="outcome-succeeded"]').closest('label').getBoundingClientRect();
			var f = document.querySelector('[data-testid="outcome-failed"]').closest('label').getBoundingClientRect();
			return f.top >= s.bottom - 1 && Math.abs(f.left - s.left) < 2;
		})()`))
		if err != nil {
			t.Fatal(err)
		}
		if !apart {
			t.Errorf("at %d px the two outcomes share a line", width)
		}
	}
}
