package web_test

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Live fragments replace the dashboard's tiles and lists every time they
// change: the element with the keyboard's focus went with them, and focus
// fell to the page's body (a reviewer tabbing the dashboard lost it every
// few seconds). The same place in the new fragment takes it back: the tile's
// link, or the dead letter's row link while that row is still listed.
func TestBrowserLiveUpdatesKeepTheKeyboardFocus(t *testing.T) {
	h := start(t, options{tick: 100 * time.Millisecond})
	seedDeadEvents(t, h, "focus", 1)
	ctx, console := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	browserLogin(tctx, t, h, "oncall")
	waitJS(tctx, t, "websocket open", `document.getElementById('conn').dataset.state === 'open'`)
	waitJS(tctx, t, "one dead letter", `document.querySelector('[data-testid="dead"]').textContent.trim() === '1'`)

	focus := func(sel string) {
		t.Helper()
		waitJS(tctx, t, "focus on "+sel, `(function(){var e=document.querySelector('`+sel+`'); if(!e) return false; e.focus(); return document.activeElement === e})()`)
	}
	focus(`[data-testid="dead"]`)
	seedMoreDead(t, h, "focus", 1)
	waitJS(tctx, t, "two dead letters", `document.querySelector('[data-testid="dead"]').textContent.trim() === '2'`)
	waitJS(tctx, t, "the tile's link keeps the focus", `document.activeElement && document.activeElement.dataset.testid === 'dead'`)

	// A row of the latest dead letters: the list is swapped when a new one
	// arrives, and the row that had the focus keeps it.
	href, err := chromedp.Run(tctx, chromedp.Evaluate[string](`document.querySelector('[data-testid="recent-dead"] li:last-child a').getAttribute('href')`))
	if err != nil || href == "" {
		t.Fatalf("a dead letter's link: %q %v", href, err)
	}
	focus(`[data-testid="recent-dead"] a[href="` + href + `"]`)
	seedDeadEvents(t, h, "focus-again", 1)
	waitJS(tctx, t, "three listed", `document.querySelectorAll('[data-testid="recent-dead"] li').length === 3`)
	waitJS(tctx, t, "the row's link keeps the focus", `document.activeElement && document.activeElement.getAttribute('href') === '`+href+`'`)
	if p := console.problems(); len(p) > 0 {
		t.Fatalf("browser reported problems: %q", p)
	}
}
