package web_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The outbox in a real browser: support finds a dead event by its id
// prefix and reads its whole error; on-call retries it and dead-letters
// another with a reason; a second support tab on the dashboard sees both
// changes, and the support tab on the retried event's page hears of its
// retry, without reloading.
func TestBrowserOutboxFindRetryDeadLetterLive(t *testing.T) {
	h := start(t, options{tick: 250 * time.Millisecond})
	longErr := "publish to orders: " + strings.Repeat("nats: maximum payload exceeded; ", 12) + "END-OF-ERROR"
	dead := plant(t, h, planted{aggID: "browser-a", status: "dead", attempts: 10, lastError: longErr})
	pending := plant(t, h, planted{aggID: "browser-b", status: "pending", attempts: 2})

	ctx, console := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	tab := func() context.Context {
		c, cancel := chromedp.NewContext(tctx, chromedp.WithNewBrowserContext()) // its own cookies
		t.Cleanup(cancel)
		return c
	}
	support, watcher, oncall := tab(), tab(), tab()

	// Support finds the event by the start of its id and reads its error.
	browserLogin(support, t, h, "support")
	if err := chromedp.Do(support,
		chromedp.Navigate(h.base+"/outbox"),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="f-id-prefix"]`)),
		chromedp.SendKeys(chromedp.CSS(`[data-testid="f-id-prefix"]`), dead.String()[:13]),
		chromedp.Click(chromedp.CSS(`[data-testid="f-submit"]`)),
	); err != nil {
		t.Fatalf("support: search by id prefix: %v", err)
	}
	// The filter is a plain GET form: the list's rows are on screen before
	// the click too, so wait for the searched page, not for any row.
	waitJS(support, t, "the search's page", fmt.Sprintf(`new URLSearchParams(location.search).get('id_prefix') === %q
		&& document.readyState === 'complete' && document.querySelectorAll('[data-testid="row-link"]').length === 1`, dead.String()[:13]))
	if got := text(support, t, `[data-testid="row-id"]`); got != dead.String() {
		t.Fatalf("support found %q, want %s", got, dead)
	}
	if err := chromedp.Do(support,
		chromedp.Click(chromedp.CSS(`[data-testid="row-link"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="last-error"]`)),
	); err != nil {
		t.Fatalf("support: open the event: %v", err)
	}
	if got := text(support, t, `[data-testid="last-error"]`); got != longErr {
		t.Fatalf("support reads %q, want the whole error", got)
	}
	if n, err := chromedp.Run(support, chromedp.Evaluate[int](`document.querySelectorAll('[data-testid="actions"]').length`)); err != nil || n != 0 {
		t.Fatalf("support sees actions (%d, %v)", n, err)
	}
	waitJS(support, t, "support's event page is live", `document.getElementById('conn').dataset.state === 'open'`)
	// Counts the pushed fragments the event page has no target for (the
	// dashboard's, when its socket was the dashboard's): there must be none.
	if _, err := chromedp.Run(support, chromedp.Evaluate[bool](`window.__oobNoTarget = 0;
		document.body.addEventListener('htmx:oobErrorNoTarget', function(){ window.__oobNoTarget++ });
		window.__notReloaded = true`)); err != nil {
		t.Fatal(err)
	}

	// A second support tab watches the dashboard.
	browserLogin(watcher, t, h, "support")
	waitJS(watcher, t, "the dashboard is live", `document.getElementById('conn').dataset.state === 'open'`)
	waitJS(watcher, t, "one dead letter", `document.querySelector('[data-testid="dead"]').textContent.trim() === '1'`)
	if _, err := chromedp.Run(watcher, chromedp.Evaluate[bool](`window.__notReloaded = true`)); err != nil {
		t.Fatal(err)
	}

	// On-call retries the dead event and dead-letters the pending one.
	browserLogin(oncall, t, h, "oncall")
	if err := chromedp.Do(oncall,
		chromedp.Navigate(h.base+"/outbox/"+dead.String()),
		chromedp.Click(chromedp.CSS(`[data-testid="action-retry"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="notice"]`)),
	); err != nil {
		t.Fatalf("oncall: retry: %v", err)
	}
	if got := text(oncall, t, `[data-testid="event-status"]`); got != "pending" {
		t.Errorf("after the retry the page shows %q", got)
	}
	const reason = "schema v3 not deployed on the consumer yet"
	if err := chromedp.Do(oncall,
		chromedp.Navigate(h.base+"/outbox/"+pending.String()),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="reason-dead-letter"]`)),
		chromedp.SendKeys(chromedp.CSS(`[data-testid="reason-dead-letter"]`), reason),
		chromedp.Click(chromedp.CSS(`[data-testid="action-dead-letter"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="dead-reason"]`)),
	); err != nil {
		t.Fatalf("oncall: dead-letter: %v", err)
	}
	if got := text(oncall, t, `[data-testid="dead-reason"]`); got != reason {
		t.Errorf("dead reason %q", got)
	}

	// Both changes reach the open pages without a reload.
	waitJS(watcher, t, "the dashboard lists the new dead letter, not the retried one",
		`(function(){var l=document.querySelectorAll('[data-testid="recent-dead"] a');
		  return l.length === 1 && l[0].getAttribute('href') === '/outbox/`+pending.String()+`'})()`)
	waitJS(watcher, t, "one dead letter again", `document.querySelector('[data-testid="dead"]').textContent.trim() === '1'`)
	waitJS(support, t, "the event page says its event changed",
		`(function(){var n=document.querySelector('[data-testid="record-changes"]'); return n !== null && document.getElementById('record-changed').textContent.indexOf('status dead → pending') >= 0})()`)
	waitJS(watcher, t, "no reload of the dashboard", `window.__notReloaded === true`)
	waitJS(support, t, "no reload of the event page", `window.__notReloaded === true`)
	if n, err := chromedp.Run(support, chromedp.Evaluate[int](`window.__oobNoTarget`)); err != nil || n != 0 {
		t.Fatalf("the event page got %d fragments it has no target for (%v)", n, err)
	}
	if p := console.problems(); len(p) > 0 {
		t.Fatalf("browser reported problems: %q", p)
	}
	if png, err := chromedp.Run(support, chromedp.CaptureScreenshot()); err == nil {
		_ = os.WriteFile("/tmp/outbox-event.png", png, 0o644)
	}
}

// A page that answers a form's POST (here a conflict: someone retried the
// event first) shows its own address, so reloading it reads the page again
// instead of sending the form a second time.
func TestBrowserAConflictPageReloadsWithoutResending(t *testing.T) {
	h := start(t, options{})
	dead := plant(t, h, planted{aggID: "reload-a", status: "dead", attempts: 5, lastError: "refused"})
	ctx, _ := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	browserLogin(tctx, t, h, "oncall")
	if err := chromedp.Do(tctx, chromedp.Navigate(h.base+"/outbox/"+dead.String()), chromedp.WaitVisible(chromedp.CSS(`[data-testid="action-retry"]`))); err != nil {
		t.Fatal(err)
	}
	// Someone else retries it first.
	b, token := h.signedIn(t, "admin")
	if resp, _ := h.postForm(t, b, "/outbox/"+dead.String()+"/retry", url.Values{"csrf_token": {token}, "expected": {"dead"}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the other retry: %d", resp.StatusCode)
	}
	refused := func() int {
		return h.countAudit(t, `action = 'outbox.retry' AND outcome <> 'ok' AND target_id = $1`, dead.String())
	}
	if err := chromedp.Do(tctx, chromedp.Click(chromedp.CSS(`[data-testid="action-retry"]`)), chromedp.WaitVisible(chromedp.CSS(`[data-testid="conflict"]`))); err != nil {
		t.Fatalf("the stale retry: %v", err)
	}
	if n := refused(); n != 1 {
		t.Fatalf("%d refused retries audited, want 1", n)
	}
	path, err := chromedp.Run(tctx, chromedp.Evaluate[string](`location.pathname`))
	if err != nil || path != "/outbox/"+dead.String() {
		t.Fatalf("the conflict page's address is %q, want the event's (%v)", path, err)
	}
	if err := chromedp.Do(tctx, chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`[data-testid="timeline"]`))); err != nil {
		t.Fatalf("reload: %v", err)
	}
	if n := refused(); n != 1 {
		t.Fatalf("the reload sent the retry again: %d refused retries audited", n)
	}
}
