package web_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The dashboard's linked figures are named by what they count, and the
// Approvals figure links to /approvals only for a user who may open it
// (operators and admins; support got a 403 there): on the page as served
// and after the live feed has replaced the tiles with its own fragment,
// which is the same for every user.
func TestBrowserDashboardTileLinksNamedApprovalsByRole(t *testing.T) {
	h := start(t, options{tick: 250 * time.Millisecond})
	seedDeadEvents(t, h, "sluice.orders", 2)
	ctx, console := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()

	visible := func(sel string) string {
		return fmt.Sprintf(`(() => { const e = document.querySelector(%q); return e !== null && e.getClientRects().length > 0 })()`, sel)
	}
	check := func(user, when string, approver bool) {
		t.Helper()
		type tiles struct {
			DeadName, Dead, UnknownName string
			Link, Plain                 bool
			LinkName                    string
		}
		got, err := chromedp.Run(tctx, chromedp.Evaluate[tiles](`(() => {
			const q = s => document.querySelector(s);
			return {DeadName: q('[data-testid="dead"]').getAttribute('aria-label'), Dead: q('[data-testid="dead"]').textContent.trim(),
				UnknownName: q('[data-testid="unknown"]').getAttribute('aria-label'),
				Link: `+visible(`[data-testid="approvals-waiting-link"]`)+`, Plain: `+visible(`[data-testid="approvals-waiting"]`)+`,
				LinkName: (q('[data-testid="approvals-waiting-link"]') || {getAttribute: () => ''}).getAttribute('aria-label')};
		})()`))
		if err != nil {
			t.Fatalf("%s, %s: %v", user, when, err)
		}
		if got.DeadName != got.Dead+" dead letters" || got.UnknownName != "0 unknown payments" {
			t.Errorf("%s, %s: links named %q (figure %q) and %q", user, when, got.DeadName, got.Dead, got.UnknownName)
		}
		if got.Link != approver || got.Plain == approver || got.LinkName != "0 approvals waiting" {
			t.Errorf("%s, %s: approvals link shown %v, plain figure shown %v, named %q; want the link %v",
				user, when, got.Link, got.Plain, got.LinkName, approver)
		}
	}
	for _, c := range []struct {
		user     string
		approver bool
	}{{"support", false}, {"oncall", true}} {
		browserLogin(tctx, t, h, c.user)
		check(c.user, "as served", c.approver)
		if _, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`document.getElementById('tiles').__served = true`)); err != nil {
			t.Fatal(err)
		}
		seedDeadEvents(t, h, "sluice."+c.user, 1) // a new figure: the feed pushes the tiles again
		waitJS(tctx, t, c.user+": the tiles pushed live", `document.getElementById('tiles').__served !== true`)
		check(c.user, "pushed live", c.approver)
		if err := chromedp.Do(tctx, chromedp.Click(chromedp.CSS(`[data-testid="logout"]`)),
			chromedp.WaitVisible(chromedp.CSS(`[data-testid="sign-in"]`))); err != nil {
			t.Fatalf("%s: logout: %v", c.user, err)
		}
	}
	if p := console.problems(); len(p) > 0 {
		t.Fatalf("browser reported problems: %q", p)
	}
}
