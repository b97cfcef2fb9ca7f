package web_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/accessibility"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/outbox/outboxtest"
	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
	"github.com/sluice-dev/sluice/web"
)

// overflowJS measures the page against the viewport: how wide the document
// is, the outermost elements that reach past the window's right edge (for
// the failure message), and how many boxes hold content wider than
// themselves (a table scrolling sideways in its panel).
const overflowJS = `(() => {
  const vw = window.innerWidth, wide = [];
  const name = el => el.tagName.toLowerCase() + (typeof el.className === 'string' && el.className.trim() ? '.' + el.className.trim().replace(/\s+/g, '.') : '') +
    (el.dataset && el.dataset.testid ? '[' + el.dataset.testid + ']' : '');
  for (const el of document.querySelectorAll('body *')) {
    const r = el.getBoundingClientRect();
    if (r.right <= vw + 0.5 || (el.parentElement && el.parentElement.getBoundingClientRect().right > vw + 0.5)) continue;
    wide.push((el.parentElement ? name(el.parentElement) + ' > ' : '') + name(el) + ' ' + Math.round(r.right) + 'px');
  }
  const scrolling = Array.from(document.querySelectorAll('.panel, .scroll')).filter(b => b.scrollWidth > b.clientWidth).length;
  return JSON.stringify({doc: document.documentElement.scrollWidth, vw, wide: wide.slice(0, 8), scrolling});
})()`

// On a phone (400 CSS pixels) the page is never wider than the screen:
// wide tables scroll sideways inside their own box (a panel, or the box
// around a list's table), and the top bar, the filters and the panels stay
// in view. The times read in Tokyo's zone, as on the reviewer's phone: the
// longest local text ("12:57:38.779 AM GMT+9").
func TestBrowserPhoneWidthKeepsPagesInTheViewport(t *testing.T) {
	h, s := comfortHarness(t)
	// The payment's page with its wide tables: provider calls, an event
	// and an audit row.
	if _, err := h.pool.Exec(context.Background(), `
		INSERT INTO payment_provider_call (operation_id, op, started_at, duration_us, answer, error)
		VALUES ($1, 'charge', now() - interval '3 minutes', 30000000, NULL, 'Post "http://provider.internal/charges": context deadline exceeded'),
		       ($1, 'inquire', now() - interval '1 minute', 12000, 'unknown', NULL)`, s.op); err != nil {
		t.Fatal(err)
	}
	outboxtest.Insert(t, h.pool, outboxtest.Seed{Topic: "payments", AggregateType: "payment", AggregateID: s.op, EventType: "payment.unknown.v1"})
	record(t, h, audit.Event{ActorSub: "sub-carol", ActorName: "Carol", ActorRoles: []string{"operator"}, Action: "payments.inquire",
		TargetType: "payment", TargetID: s.op, Reason: "customer called support about the charge"})
	ctx, console := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	if err := chromedp.Do(tctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		if _, err := cdp.Call(ctx, tg, emulation.SetLocaleOverride, emulation.SetLocaleOverrideParams{Locale: "en-US"}); err != nil {
			return err
		}
		_, err := cdp.Call(ctx, tg, emulation.SetTimezoneOverride, emulation.SetTimezoneOverrideParams{TimezoneID: "Asia/Tokyo"})
		return err
	})); err != nil {
		t.Fatal(err)
	}
	browserLogin(tctx, t, h, "admin")
	if err := chromedp.Do(tctx, chromedp.EmulateViewport(400, 800)); err != nil {
		t.Fatal(err)
	}
	// These pages hold a table wider than the phone: it must scroll in its
	// box, not be cut or squeezed out of sight. (The lists whose rows
	// carry actions are cards instead: the next test.)
	wideTable := map[string]bool{"/audit": true, "/payments/" + s.op: true, "/payments/discrepancies": true}
	pages := []string{"/", "/audit", "/audit/" + strconv.FormatInt(s.seqs[0], 10), "/outbox", "/outbox?status=dead",
		"/outbox/" + s.dead, "/payments", "/payments?status=unknown", "/payments/" + s.op, "/inbox", "/relays", "/jobs",
		"/outbox/bulk", "/approvals", "/payments/settlements", "/payments/discrepancies"}
	for _, path := range pages {
		if err := chromedp.Do(tctx, chromedp.Navigate(h.base+path), chromedp.WaitVisible(chromedp.CSS(`[data-testid="nav"]`))); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if path == "/" {
			waitJS(tctx, t, "the dead letter listed", `document.querySelectorAll('[data-testid="recent-dead"] li').length === 1`)
		}
		waitJS(tctx, t, path+": times localized", `Array.from(document.querySelectorAll('time[data-local]')).every(e => e.dataset.shown === e.getAttribute('datetime'))`)
		raw, err := chromedp.Run(tctx, chromedp.Evaluate[string](overflowJS))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		var m struct {
			Doc, VW, Scrolling int
			Wide               []string
		}
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			t.Fatalf("%s: %v in %s", path, err, raw)
		}
		if m.VW != 400 {
			t.Fatalf("%s: the window is %dpx wide, want the emulated 400px", path, m.VW)
		}
		if m.Doc > m.VW {
			t.Errorf("%s: the page is %dpx wide on a %dpx screen; past the edge: %v", path, m.Doc, m.VW, m.Wide)
		}
		if wideTable[path] && m.Scrolling == 0 {
			t.Errorf("%s: no table scrolls in its box; the check saw nothing wider than the phone", path)
		}
	}
	// A swipe moves the audit table in its box; the page stays put.
	if err := chromedp.Do(tctx, chromedp.Navigate(h.base+"/audit"), chromedp.WaitVisible(chromedp.CSS(`[data-testid="rows"]`))); err != nil {
		t.Fatal(err)
	}
	waitJS(tctx, t, "the audit table scrolls in its box", `(() => {
		const box = document.querySelector('[data-testid="rows"]').parentElement;
		box.scrollLeft = 100;
		return box.scrollLeft > 0 && window.scrollX === 0 && document.documentElement.scrollWidth <= window.innerWidth;
	})()`)
	if p := console.problems(); len(p) > 0 {
		t.Fatalf("browser reported problems: %q", p)
	}
}

// The settlement page's heading names the file by its sha256 as sha256sum
// prints it, in lower case: the heading's capitals (CSS) leave the hash as
// it is, as read on screen (innerText follows text-transform).
func TestBrowserSettlementHashShowsInLowerCase(t *testing.T) {
	h := start(t, options{})
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{})
	file := filepath.Join(t.TempDir(), "eod.csv")
	if err := os.WriteFile(file, []byte(op.String()+",succeeded\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, console := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	browserLogin(tctx, t, h, "oncall")
	if err := chromedp.Do(tctx, chromedp.Navigate(h.base+"/payments/settlements"),
		chromedp.SetUploadFiles(chromedp.CSS(`#settlement-file`), []string{file}),
		chromedp.Click(chromedp.CSS(`[data-testid="upload"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="sha256"]`))); err != nil {
		t.Fatal(err)
	}
	shown, err := chromedp.Run(tctx, chromedp.Evaluate[string](`document.querySelector('[data-testid="sha256"]').innerText`))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^sha256:[0-9a-f]{64}$`).MatchString(shown) {
		t.Errorf("the heading shows the hash as %q, want sha256:<64 lower-case hex digits>", shown)
	}
	heading, err := chromedp.Run(tctx, chromedp.Evaluate[string](`document.querySelector('[data-testid="diff"] h2').innerText`))
	if err != nil {
		t.Fatal(err)
	}
	if want := "DRY RUN " + shown; heading != want {
		t.Errorf("heading %q, want %q (the words in capitals, the hash as it is)", heading, want)
	}
	if p := console.problems(); len(p) > 0 {
		t.Fatalf("browser reported problems: %q", p)
	}
}

// An id and its copy button share a line in the lists, at a desktop width
// too: a reviewer saw the buttons of the unfiltered outbox list wrap under
// their ids at 1280 pixels.
func TestBrowserCopyButtonsStayBesideTheirIDs(t *testing.T) {
	h, _ := comfortHarness(t)
	// Long names squeeze the id column, as the demo's events did.
	for i := range 3 {
		outboxtest.Insert(t, h.pool, outboxtest.Seed{Topic: "sluice.orders.fulfilment.warehouse-europe-west", AggregateType: "customer-order-fulfilment",
			AggregateID: "order-2026-12-07-" + strconv.Itoa(i) + "-warehouse-europe-west-shipment", EventType: "order.fulfilment.shipment.dispatched.v12",
			Status: "dead", Attempts: 5, LastError: "broker refused the message: payload fails the topic's schema (field shipment.lines[3].sku)"})
	}
	ctx, _ := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	browserLogin(tctx, t, h, "admin")
	if err := chromedp.Do(tctx, chromedp.EmulateViewport(1280, 900)); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/outbox", "/outbox?status=dead", "/payments"} {
		if err := chromedp.Do(tctx, chromedp.Navigate(h.base+path), chromedp.WaitVisible(chromedp.CSS(`[data-testid="nav"]`))); err != nil {
			t.Fatal(err)
		}
		// Each button's vertical middle lies within its cell's first line.
		wrapped, err := chromedp.Run(tctx, chromedp.Evaluate[int](`Array.from(document.querySelectorAll('td > .copy-id')).filter(b => {
			const id = b.parentElement.firstElementChild.getBoundingClientRect(), r = b.getBoundingClientRect();
			return r.top + r.height / 2 > id.bottom || r.top + r.height / 2 < id.top;
		}).length`))
		if err != nil {
			t.Fatal(err)
		}
		n, _ := chromedp.Run(tctx, chromedp.Evaluate[int](`document.querySelectorAll('td > .copy-id').length`))
		if n == 0 {
			t.Fatalf("%s: no copy button in a table cell: the check is void", path)
		}
		if wrapped != 0 {
			t.Errorf("%s: %d of %d copy buttons wrapped below their id", path, wrapped, n)
		}
	}
}

// phoneRowsJS measures, on a phone, what a list's rows must keep in view:
// the rows' identifying links and action buttons (sel: CSS selectors of
// both) must lie within the window's width with the page and every box
// around them unscrolled, and no table may scroll sideways in its box (the
// reviewer found Approve at x≈675 on a 400 px screen, hidden in a box
// that scrolled with no hint). Every cell of the rows is measured too: a
// card shows all of its row.
const phoneRowsJS = `((sel) => {
  const vw = window.innerWidth, out = [], name = el => el.tagName.toLowerCase() + (el.dataset.testid ? '[' + el.dataset.testid + ']' : '');
  const seen = document.querySelectorAll(sel);
  for (const el of [...seen, ...document.querySelectorAll('table.cards > tbody > tr > td')]) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue; // an empty cell, not shown
    if (r.left < -0.5 || r.right > vw + 0.5) out.push(name(el) + ' ' + Math.round(r.left) + '..' + Math.round(r.right) + 'px');
  }
  const scrolling = Array.from(document.querySelectorAll('.panel, .scroll')).filter(b => b.scrollWidth > b.clientWidth + 1 && b.querySelector('table.cards'))
    .map(b => b.scrollWidth + 'px in ' + b.clientWidth + 'px');
  return JSON.stringify({vw, doc: document.documentElement.scrollWidth, scrollX: window.scrollX, n: seen.length, out: out.slice(0, 8), scrolling});
})`

// At 400 pixels (a phone) the rows of the payments list, the dead letters,
// the approvals and a trace are cards: each row's link and its buttons
// (Retry; Approve and Reject, whose reason field opens under it) are on
// the screen without scrolling sideways, the page is no wider than the
// screen, and the approvals are still a table to a screen reader (its
// rows, header names and cells in the accessibility tree).
func TestBrowserPhoneWidthShowsEachRowsLinkAndActions(t *testing.T) {
	h := start(t, options{tick: 250 * time.Millisecond, configure: func(c *web.Config) { c.FourEyesAbove = decimal.RequireFromString("100.00") }})
	// Long names, as the demo's dead letters have.
	for i := range 2 {
		outboxtest.Insert(t, h.pool, outboxtest.Seed{Topic: "sluice.orders.fulfilment.warehouse-europe-west", AggregateType: "customer-order-fulfilment",
			AggregateID: "order-2026-12-07-" + strconv.Itoa(i) + "-warehouse-europe-west-shipment", EventType: "order.fulfilment.shipment.dispatched.v12",
			Status: "dead", Attempts: 5, LastError: "broker refused the message: payload fails the topic's schema (field shipment.lines[3].sku)"})
	}
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "4500.00", Merchant: "merchant-with-a-long-name-europe-west", Invoice: "invoice-2026-12-07-000000000042"})
	oncall, token := h.signedIn(t, "oncall")
	if resp, _ := h.postForm(t, oncall, "/payments/"+op.String()+"/resolve", resolveForm(token, "succeeded")); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the four-eyes request: %d", resp.StatusCode)
	}
	ctx, console := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	browserLogin(tctx, t, h, "admin")
	if err := chromedp.Do(tctx, chromedp.EmulateViewport(400, 800)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path, sel string
		n         int // elements sel must find
	}{
		{"/payments", `[data-testid="row-link"], [data-testid="row-status"]`, 2},
		{"/outbox?status=dead", `[data-testid="row-link"], [data-testid="row-retry"]`, 4},
		// The reject form opened, as a tap on "Reject…" does.
		{"/approvals", `[data-testid="approval-link"], [data-testid="approval-invoice"], [data-testid="approval-payment-status"], [data-testid="approve"], [data-testid="reject-open"], [data-testid="reject-reason"], [data-testid="reject"]`, 7},
		{"/trace/payment/" + op.String(), `[data-testid="step-title"], [data-testid="step-link"]`, 6},
	} {
		if err := chromedp.Do(tctx, chromedp.Navigate(h.base+c.path), chromedp.WaitVisible(chromedp.CSS(`[data-testid="nav"]`))); err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		if c.path == "/approvals" {
			if err := chromedp.Do(tctx, chromedp.Click(chromedp.CSS(`[data-testid="reject-open"]`)), chromedp.WaitVisible(chromedp.CSS(`[data-testid="reject"]`))); err != nil {
				t.Fatal(err)
			}
		}
		raw, err := chromedp.Run(tctx, chromedp.Evaluate[string](phoneRowsJS+"("+strconv.Quote(c.sel)+")"))
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		var m struct {
			VW, Doc, N     int
			ScrollX        float64
			Out, Scrolling []string
		}
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			t.Fatalf("%s: %v in %s", c.path, err, raw)
		}
		if m.VW != 400 {
			t.Fatalf("%s: the window is %dpx wide, want the emulated 400px", c.path, m.VW)
		}
		if m.N < c.n {
			t.Fatalf("%s: %d elements of %s, want at least %d: the check is void", c.path, m.N, c.sel, c.n)
		}
		if len(m.Out) > 0 || len(m.Scrolling) > 0 || m.ScrollX != 0 {
			t.Errorf("%s: past the screen's edges: %v; tables scrolling sideways: %v; page scrolled by %vpx", c.path, m.Out, m.Scrolling, m.ScrollX)
		}
		if m.Doc > m.VW {
			t.Errorf("%s: the page is %dpx wide on a %dpx screen", c.path, m.Doc, m.VW)
		}
		if c.path == "/outbox?status=dead" {
			// The last error is read whole on a phone, not cut into a
			// tooltip a finger cannot open.
			cut, err := chromedp.Run(tctx, chromedp.Evaluate[int](`[...document.querySelectorAll('[data-testid="row-error"]')].filter(e => e.scrollWidth > e.clientWidth + 1).length`))
			if err != nil || cut != 0 {
				t.Errorf("%s: %d last errors cut at 400px (%v)", c.path, cut, err)
			}
		}
	}

	// At a desktop's width, a request whose evidence is one long word (a
	// settlement file's sha256) keeps Approve and Reject in the window: the
	// hash widened the table past it.
	long, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "4600.00", Invoice: "invoice-long-evidence"})
	form := resolveForm(token, "succeeded")
	form.Set("evidence", "settlement sha256:"+strings.Repeat("9f86d081884c7d65", 4)+" line 2")
	if resp, _ := h.postForm(t, oncall, "/payments/"+long.String()+"/resolve", form); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the request with long evidence: %d", resp.StatusCode)
	}
	if err := chromedp.Do(tctx, chromedp.EmulateViewport(1280, 800), chromedp.Navigate(h.base+"/approvals"),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="approve"]`))); err != nil {
		t.Fatal(err)
	}
	right, err := chromedp.Run(tctx, chromedp.Evaluate[float64](`Math.max(...[...document.querySelectorAll('[data-testid="approve"], [data-testid="reject-open"]')].map(e => e.getBoundingClientRect().right))`))
	if err != nil || right > 1280 || right <= 0 {
		t.Errorf("at 1280px the approvals' buttons end at %vpx (%v), want inside the window", right, err)
	}
	if err := chromedp.Do(tctx, chromedp.EmulateViewport(400, 800)); err != nil {
		t.Fatal(err)
	}

	// Still a table to a screen reader, on the phone: the Approve button
	// sits in a cell of a row of a table, and the hidden header row still
	// names the columns.
	if err := chromedp.Do(tctx, chromedp.Navigate(h.base+"/approvals"), chromedp.WaitVisible(chromedp.CSS(`[data-testid="approve"]`))); err != nil {
		t.Fatal(err)
	}
	tree, err := chromedp.Run(tctx, chromedp.Action[accessibility.GetFullAXTreeResult](func(ctx context.Context, tg *chromedp.Target) (accessibility.GetFullAXTreeResult, error) {
		return cdp.Call(ctx, tg, accessibility.GetFullAXTree, accessibility.GetFullAXTreeParams{})
	}))
	if err != nil {
		t.Fatal(err)
	}
	byID := map[accessibility.NodeID]*accessibility.Node{}
	for _, n := range tree.Nodes {
		byID[n.NodeID] = n
	}
	role := func(n *accessibility.Node) string { return axString(n.Role) }
	var approve *accessibility.Node
	headers := map[string]bool{}
	for _, n := range tree.Nodes {
		switch {
		case role(n) == "button" && axString(n.Name) == "Approve":
			approve = n
		case role(n) == "columnheader":
			headers[axString(n.Name)] = true
		}
	}
	if approve == nil {
		t.Fatal("no Approve button in the accessibility tree")
	}
	var up []string
	for n := byID[approve.ParentID]; n != nil; n = byID[n.ParentID] {
		if r := role(n); r == "cell" || r == "row" || r == "table" {
			up = append(up, r)
		}
	}
	if strings.Join(up, " ") != "cell row table" {
		t.Errorf("the Approve button's table ancestors: %q, want cell, row, table", up)
	}
	for _, want := range []string{"Payment", "Invoice", "Amount", "Payment now", "Reason", "State"} {
		if !headers[want] {
			t.Errorf("no column header %q in the accessibility tree (have %v)", want, headers)
		}
	}
	if p := console.problems(); len(p) > 0 {
		t.Fatalf("browser reported problems: %q", p)
	}
}

// axString is an accessibility value as text ("" when it has none).
func axString(v *accessibility.Value) string {
	if v == nil {
		return ""
	}
	var s string
	if json.Unmarshal([]byte(v.Value), &s) != nil {
		return ""
	}
	return s
}
