package web_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
	"github.com/sluice-dev/sluice/internal/testkit"
)

const chromiumPath = "/usr/bin/chromium"

// newChrome starts headless Debian chromium. A missing browser is a
// failure with the install hint, never a skip.
func newChrome(t *testing.T) (context.Context, *consoleLog) {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("browser tests need chromium at %s: apt-get install -y chromium", chromiumPath)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 860),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	cl := &consoleLog{}
	ctx, cancelCtx := chromedp.NewContext(allocCtx, chromedp.WithListener(cl.record))
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		cancelCtx()
		cancelAlloc()
		t.Fatalf("start chromium: %v", err)
	}
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	return ctx, cl
}

// consoleLog collects the browser's console and log output, so a CSP
// violation or script error fails the test.
type consoleLog struct {
	mu    sync.Mutex
	lines []string
}

func (c *consoleLog) record(ev any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch e := ev.(type) {
	case *log.EventEntryAdded:
		c.lines = append(c.lines, string(e.Entry.Level)+": "+e.Entry.Text)
	case *runtime.EventExceptionThrown:
		c.lines = append(c.lines, "exception: "+e.ExceptionDetails.Text)
	}
}

func (c *consoleLog) problems() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, l := range c.lines {
		if strings.Contains(l, "Content Security Policy") || strings.HasPrefix(l, "exception") {
			out = append(out, l)
		}
	}
	return out
}

func text(ctx context.Context, t *testing.T, sel string) string {
	t.Helper()
	var (
		s   string
		err error
	)
	// A live page may replace the element between chromedp finding it and
	// reading it; it is then read again (see nodeGone).
	for range 5 {
		if s, err = chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel))); !nodeGone(err) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("read %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

// nodeGone says whether chromedp failed because the element it had found was
// replaced before it acted on it (a live fragment swapped in): nothing was
// read or clicked, and acting again on the new element is safe.
func nodeGone(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "Could not find node") || strings.Contains(err.Error(), "No node with given id"))
}

// waitJS polls a JavaScript condition with a generous deadline.
func waitJS(ctx context.Context, t *testing.T, what, expr string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (%s): %v", what, expr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// clickLive clicks sel on a page whose live updates may replace the element
// between chromedp finding it and clicking it (the approvals list reloads
// when its signal arrives, also right after the page connects): chromedp
// then reports the node gone, nothing was clicked, and the click is tried
// again on the new element, a few times.
func clickLive(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		var err error
		for range 5 {
			if _, err = chromedp.Click(chromedp.CSS(sel))(ctx, tg); !nodeGone(err) {
				return err
			}
			time.Sleep(100 * time.Millisecond)
		}
		return err
	})
}

// clickLiveUntil clicks sel (as clickLive) until done is visible: a click
// that lands while the live page swaps the element out (the old node gone,
// the new one not laid out yet) does nothing, and the page waits for ever.
// A click that submitted leaves the page, so done shows and no second
// click comes.
func clickLiveUntil(sel, done string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		var err error
		for range 5 {
			if _, err = clickLive(sel)(ctx, tg); err != nil {
				return err
			}
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, err = chromedp.WaitVisible(chromedp.CSS(done))(wctx, tg)
			cancel()
			if err == nil || ctx.Err() != nil {
				return err
			}
		}
		return err
	})
}

func browserLogin(ctx context.Context, t *testing.T, h *harness, user string) {
	t.Helper()
	err := chromedp.Do(ctx,
		chromedp.Navigate(h.base+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#username`)),
		chromedp.SendKeys(chromedp.CSS(`#username`), user),
		chromedp.SendKeys(chromedp.CSS(`#password`), user),
		chromedp.Click(chromedp.CSS(`#submit`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="nav"]`)),
	)
	if err != nil {
		t.Fatalf("%s: login through the provider's form: %v", user, err)
	}
}

func TestBrowserLoginLiveDashboardAndLogout(t *testing.T) {
	h := start(t, options{tick: 250 * time.Millisecond})
	ctx, console := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()

	// The audit pages are for auditors and admins: only they see the link.
	for _, c := range []struct {
		user, role string
		audit      bool
	}{{"support", "viewer", false}, {"oncall", "operator", false}, {"auditor", "auditor", true}, {"admin", "admin", true}} {
		browserLogin(tctx, t, h, c.user)
		if got := text(tctx, t, `[data-testid="role"]`); !strings.EqualFold(got, c.role) {
			t.Errorf("%s: role %q, want %q", c.user, got, c.role)
		}
		hasAudit, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`document.querySelector('[data-testid="nav-audit"]') !== null`))
		if err != nil {
			t.Fatal(err)
		}
		if hasAudit != c.audit {
			t.Errorf("%s: audit link shown=%v, want %v", c.user, hasAudit, c.audit)
		}
		waitJS(tctx, t, c.user+": websocket open", `document.getElementById('conn').dataset.state === 'open'`)
		if c.user == "admin" {
			break // stays signed in for the live part
		}
		if err := chromedp.Do(tctx, chromedp.Click(chromedp.CSS(`[data-testid="logout"]`)),
			chromedp.WaitVisible(chromedp.CSS(`[data-testid="sign-in"]`))); err != nil {
			t.Fatalf("%s: logout: %v", c.user, err)
		}
	}

	// Live: the numbers on the open page follow the database, without reload.
	if _, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`window.__notReloaded = true`)); err != nil {
		t.Fatal(err)
	}
	waitJS(tctx, t, "empty backlog", `document.querySelector('[data-testid="backlog"]').textContent.trim() === '0'`)
	for i := 0; i < 3; i++ {
		insertEvent(t, h, "payments")
	}
	account := paymentstest.Account(t, h.pool, paymentstest.AccountOpts{ID: 7, Balance: "1000"})
	paymentstest.Payment(t, h.pool, paymentstest.PaymentOpts{Account: account, Merchant: "m1", Invoice: "inv-1", Amount: "250.00", Age: 3 * time.Minute})
	paymentstest.Payment(t, h.pool, paymentstest.PaymentOpts{Account: account, Merchant: "m1", Invoice: "inv-2", Amount: "75.10"})
	waitJS(tctx, t, "backlog 3 on the open page", `document.querySelector('[data-testid="backlog"]').textContent.trim() === '3'`)
	waitJS(tctx, t, "2 unknown payments on the open page", `document.querySelector('[data-testid="unknown"]').textContent.trim() === '2'`)
	waitJS(tctx, t, "the unknown list", `document.querySelectorAll('[data-testid="recent-unknown"] li').length === 2`)
	waitJS(tctx, t, "no reload", `window.__notReloaded === true`)

	png, err := chromedp.Run(tctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("/tmp/dashboard.png", png, 0o644); err != nil {
		t.Logf("screenshot not saved: %v", err)
	}

	// Logout in a second tab closes the first tab's socket.
	tab2, cancel2 := chromedp.NewContext(tctx)
	defer cancel2()
	if err := chromedp.Do(tab2, chromedp.Navigate(h.base+"/"), chromedp.WaitVisible(chromedp.CSS(`[data-testid="logout"]`))); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "two sockets", func() (bool, error) { return h.app.Feed().Clients() == 2, nil })
	if err := chromedp.Do(tab2, chromedp.Click(chromedp.CSS(`[data-testid="logout"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="sign-in"]`))); err != nil {
		t.Fatal(err)
	}
	waitJS(tctx, t, "first tab shows the socket closed", `document.getElementById('conn').dataset.state === 'closed'`)
	testkit.Eventually(t, "no sockets left", func() (bool, error) { return h.app.Feed().Clients() == 0, nil })
	if p := console.problems(); len(p) > 0 {
		t.Fatalf("browser reported problems: %q", p)
	}
	// The CSP is enforced: a script injected into the page does not run,
	// and the browser reports the violation (which also proves the listener
	// above would have seen one).
	if _, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`(function(){var s=document.createElement('script');s.textContent='window.__injected=true';document.body.appendChild(s);return true})()`)); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "a CSP violation report", func() (bool, error) { return len(console.problems()) > 0, nil })
	if ran, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`window.__injected === true`)); err != nil || ran {
		t.Fatalf("injected inline script ran: %v %v", ran, err)
	}
}
