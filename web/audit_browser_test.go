package web_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluice-dev/sluice/internal/audit"
)

// The audit trail in a real browser: the auditor filters the list by actor,
// opens a row, and downloads the filtered export with the session (the
// export link's own URL, fetched by the page).
func TestBrowserAuditFilterOpenExport(t *testing.T) {
	h := start(t, options{tick: 250 * time.Millisecond})
	seqs := record(t, h,
		audit.Event{ActorSub: "sub-carol", ActorName: "Carol", Action: "outbox.retry", TargetType: "outbox_event", TargetID: "x", Reason: "=cmd|' /C calc'!A0"},
		audit.Event{ActorSub: "sub-dave", ActorName: "Dave", Action: "outbox.discard", Reason: "other"},
	)
	ctx, _ := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	browserLogin(tctx, t, h, "auditor")
	if err := chromedp.Do(tctx,
		chromedp.Navigate(h.base+"/audit"),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="f-actor"]`)),
		chromedp.SendKeys(chromedp.CSS(`[data-testid="f-actor"]`), "Carol"),
		chromedp.Click(chromedp.CSS(`[data-testid="f-submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="row-link"]`)),
	); err != nil {
		t.Fatalf("filter: %v", err)
	}
	// The unfiltered page has rows too: wait for the filtered one.
	waitJS(tctx, t, "the list filtered to Carol's one row",
		`location.search.includes('actor=Carol') && document.querySelectorAll('[data-testid="row"]').length === 1`)
	waitJS(tctx, t, "the audit page is live", `document.getElementById('conn').dataset.state === 'open'`)
	export, err := chromedp.Run(tctx, chromedp.Evaluate[string](`document.querySelector('[data-testid="export-csv"]').getAttribute('href')`))
	if err != nil || !strings.Contains(export, "actor=Carol") {
		t.Fatalf("export link %q %v", export, err)
	}
	got, err := chromedp.Run(tctx, chromedp.Evaluate[string](`fetch(document.querySelector('[data-testid="export-csv"]').href)
		.then(r => r.text().then(body => r.status + "|" + r.headers.get('content-type') + "|" + body))`, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.SplitN(got, "|", 3)
	if len(parts) != 3 || parts[0] != "200" || parts[1] != "text/csv; charset=utf-8" {
		t.Fatalf("export: %q", got)
	}
	lines := strings.Split(strings.TrimSpace(parts[2]), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[1], strconv.FormatInt(seqs[0], 10)+",") || !strings.Contains(lines[1], `'=cmd`) {
		t.Errorf("export body %q", parts[2])
	}
	if err := chromedp.Do(tctx,
		chromedp.Click(chromedp.CSS(`[data-testid="row-link"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="hash"]`)),
	); err != nil {
		t.Fatalf("open the row: %v", err)
	}
	if got := text(tctx, t, `[data-testid="seq"]`); got != strconv.FormatInt(seqs[0], 10) {
		t.Errorf("opened row %q, want %d", got, seqs[0])
	}
	if got := text(tctx, t, `[data-testid="reason"]`); got != "=cmd|' /C calc'!A0" {
		t.Errorf("reason %q", got)
	}
}
