package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/outbox/outboxtest"
	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
	"github.com/sluice-dev/sluice/web"
)

// js runs a statement in the page as a step.
func js(stmt string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.Evaluate[bool]("(() => { "+stmt+"; return true })()")(ctx, t)
		return err
	})
}

// colorScheme emulates the system's prefers-color-scheme.
func colorScheme(scheme string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}}})
		return err
	})
}

// contrastJS walks every visible element that holds text (and every form
// control and copy button) and measures the WCAG contrast of its computed
// colour against the background it is painted on: the element's and its
// ancestors' background colours composited from the page's canvas up. It
// returns the failures below 4.5:1 and how many elements it measured.
const contrastJS = `(() => {
  const parse = c => {
    const m = c.match(/^rgba?\(([^)]+)\)$/);
    if (!m) return null;
    const p = m[1].split(/[\s,\/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const over = (top, bottom) => {
    const a = top[3];
    return [0, 1, 2].map(i => top[i] * a + bottom[i] * (1 - a)).concat([1]);
  };
  const lum = c => {
    const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
  };
  const ratio = (a, b) => { const x = lum(a), y = lum(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); };
  const canvas = matchMedia('(prefers-color-scheme: dark)').matches && getComputedStyle(document.documentElement).colorScheme !== 'light'
    || getComputedStyle(document.documentElement).colorScheme === 'dark' ? [18, 18, 18, 1] : [255, 255, 255, 1];
  const bgOf = el => {
    const chain = [];
    for (let e = el; e && e.nodeType === 1; e = e.parentElement) chain.push(e);
    let bg = canvas;
    for (let i = chain.length - 1; i >= 0; i--) {
      const c = parse(getComputedStyle(chain[i]).backgroundColor);
      if (c && c[3] > 0) bg = over(c, bg);
    }
    return bg;
  };
  const visible = el => {
    const s = getComputedStyle(el);
    return s.visibility !== 'hidden' && s.display !== 'none' && el.getClientRects().length > 0;
  };
  const fails = [];
  let measured = 0;
  for (const el of document.querySelectorAll('body *')) {
    if (el.closest('svg, script, style, option')) continue;
    const hasText = Array.from(el.childNodes).some(n => n.nodeType === 3 && n.textContent.trim() !== '');
    if (!hasText && !el.matches('button, select, input:not([type=hidden]), textarea')) continue;
    if (!visible(el)) continue;
    const s = getComputedStyle(el);
    const fg = parse(s.color);
    const bg = bgOf(el);
    if (!fg) { fails.push({el: el.tagName, text: el.textContent.trim().slice(0, 40), color: s.color, ratio: 0}); continue; }
    const r = ratio(over(fg, bg), bg);
    measured++;
    if (r < 4.5) fails.push({el: el.tagName + '.' + el.className, text: el.textContent.trim().slice(0, 40), color: s.color, bg: 'rgb(' + bg.slice(0, 3).map(Math.round).join(',') + ')', ratio: Math.round(r * 100) / 100});
  }
  return JSON.stringify({measured, fails, body: getComputedStyle(document.body).backgroundColor, bodyLum: lum(parse(getComputedStyle(document.body).backgroundColor))});
})()`

type contrastReport struct {
	Measured int `json:"measured"`
	Fails    []struct {
		El, Text, Color, Bg string
		Ratio               float64
	} `json:"fails"`
	Body    string  `json:"body"`
	BodyLum float64 `json:"bodyLum"`
}

func measureContrast(ctx context.Context, t *testing.T, where string) contrastReport {
	t.Helper()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](contrastJS))
	if err != nil {
		t.Fatalf("%s: measure contrast: %v", where, err)
	}
	var r contrastReport
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		t.Fatalf("%s: %v in %s", where, err, raw)
	}
	return r
}

// comfortHarness is a console with something on every screen: dead
// letters, pending events, unknown payments past the warning level, audit
// rows and a job; the thresholds are low so the warning tiles show.
func comfortHarness(t *testing.T) (*harness, comfortSeed) {
	t.Helper()
	h := start(t, options{tick: 250 * time.Millisecond, configure: func(c *web.Config) {
		c.WarnReconcileAge = time.Minute
		c.WarnDead = 1
	}})
	var s comfortSeed
	s.dead = outboxtest.Insert(t, h.pool, outboxtest.Seed{Topic: "orders", EventType: "order.placed.v1", Status: "dead", Attempts: 9, LastError: "broker refused: <nope>"})[0].String()
	s.old = outboxtest.Insert(t, h.pool, outboxtest.Seed{Topic: "orders", EventType: "order.placed.v1", Status: "published", Age: 49 * time.Hour})[0].String()
	outboxtest.Insert(t, h.pool, outboxtest.Seed{N: 3, Topic: "payments", EventType: "payment.captured.v1"})
	account := paymentstest.Account(t, h.pool, paymentstest.AccountOpts{ID: 7, Balance: "1000"})
	s.op = paymentstest.Payment(t, h.pool, paymentstest.PaymentOpts{Account: account, Merchant: "m1", Invoice: "inv-1", Amount: "250.00", Age: 3 * time.Minute}).String()
	s.seqs = record(t, h, audit.Event{ActorSub: "sub-carol", ActorName: "Carol", Action: "outbox.retry", TargetType: "outbox_event", TargetID: s.dead, Reason: "consumer back"})
	h.discrepancy(t) // the discrepancies list's table
	// The relays page's three states: running, paused (flagged) and silent (flagged).
	if _, err := h.pool.Exec(context.Background(), `
		INSERT INTO outbox_relay (id, name, host, pid, started_at, seen_at, expires_at, unavailable_since, shards, ordered)
		VALUES (gen_random_uuid(), 'relay-1', 'host-a', 101, now() - interval '1 hour', now(), now() + interval '1 hour', NULL, 16, true),
		       (gen_random_uuid(), 'relay-2', 'host-b', 102, now() - interval '1 hour', now(), now() + interval '1 hour', now() - interval '2 minutes', 16, true),
		       (gen_random_uuid(), 'relay-3', 'host-c', 103, now() - interval '1 hour', now() - interval '5 minutes', now() - interval '4 minutes', NULL, 0, true)`); err != nil {
		t.Fatal(err)
	}
	// The inbox page's processes: one running, one silent (flagged), and
	// shards nobody may read (a problem notice).
	if _, err := h.pool.Exec(context.Background(), `
		INSERT INTO inbox_consumer_process (id, consumer, host, pid, started_at, seen_at, expires_at, shards, owned, held)
		VALUES (gen_random_uuid(), 'orders', 'host-a', 201, now() - interval '1 hour', now(), now() + interval '1 hour', 16, '{0,1,2,3,4,5,6,7}', '{0,1,2,3,4,5,6,7}'),
		       (gen_random_uuid(), 'orders', 'host-b', 202, now() - interval '1 hour', now() - interval '5 minutes', now() - interval '4 minutes', 16, '{8,9,10,11,12,13,14,15}', '{8,9,10,11,12,13,14,15}')`); err != nil {
		t.Fatal(err)
	}
	return h, s
}

type comfortSeed struct {
	dead, old, op string
	seqs          []int64
}

// Issue 13.5: in a real browser with a dark (then light) colour scheme
// emulated, every page renders in that scheme and every text on it keeps a
// contrast of at least 4.5:1 against what it is painted on, measured from
// computed styles; the shortcuts dialog too.
func TestBrowserThemesKeepTextReadable(t *testing.T) {
	h, s := comfortHarness(t)
	ctx, console := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	browserLogin(tctx, t, h, "admin")
	pages := []string{"/", "/outbox", "/outbox?status=dead", "/outbox/" + s.dead, "/payments", "/payments/" + s.op,
		"/inbox", "/relays", "/audit", "/audit/" + strconv.FormatInt(s.seqs[0], 10), "/jobs", "/outbox/bulk", "/approvals",
		"/payments/discrepancies", "/no-such-page"}
	for _, scheme := range []string{"dark", "light"} {
		if err := chromedp.Do(tctx, colorScheme(scheme)); err != nil {
			t.Fatal(err)
		}
		for _, path := range pages {
			where := scheme + " " + path
			if err := chromedp.Do(tctx, chromedp.Navigate(h.base+path), chromedp.WaitReady(chromedp.CSS(`body`))); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			if path == "/" {
				// The numbers and lists of the first snapshot, and the live
				// feed's fragments swapped in.
				waitJS(tctx, t, where+": the dead letter listed", `document.querySelectorAll('[data-testid="recent-dead"] li').length === 1`)
				waitJS(tctx, t, where+": the unknown payment listed", `document.querySelectorAll('[data-testid="recent-unknown"] li').length === 1`)
				waitJS(tctx, t, where+": the live feed", `document.getElementById('conn').dataset.state === 'open'`)
			}
			r := measureContrast(tctx, t, where)
			if path == "/" { // for a person to look at; not asserted
				if png, err := chromedp.Run(tctx, chromedp.CaptureScreenshot()); err == nil {
					_ = os.WriteFile("/tmp/dashboard-"+scheme+".png", png, 0o644)
				}
			}
			if r.Measured < 5 {
				t.Errorf("%s: measured only %d text elements; the walk is broken", where, r.Measured)
			}
			dark := r.BodyLum < 0.05
			if dark != (scheme == "dark") {
				t.Errorf("%s: page background %s (luminance %.3f), want a %s page", where, r.Body, r.BodyLum, scheme)
			}
			for _, f := range r.Fails {
				t.Errorf("%s: contrast %.2f:1 < 4.5:1 for <%s> %q (%s on %s)", where, f.Ratio, f.El, f.Text, f.Color, f.Bg)
			}
			if path == "/outbox?status=dead" {
				// A row focused with "j" is highlighted: still readable.
				if err := chromedp.Do(tctx, chromedp.KeyEvent("j")); err != nil {
					t.Fatal(err)
				}
				waitJS(tctx, t, where+": a focused row", `!!document.querySelector('tbody tr:focus-within')`)
				for _, f := range measureContrast(tctx, t, where+" focused row").Fails {
					t.Errorf("%s, focused row: contrast %.2f:1 < 4.5:1 for <%s> %q (%s on %s)", where, f.Ratio, f.El, f.Text, f.Color, f.Bg)
				}
			}
		}
		// The dashboard with the shortcuts dialog open.
		if err := chromedp.Do(tctx, chromedp.Navigate(h.base+"/"), chromedp.WaitVisible(chromedp.CSS(`[data-testid="nav"]`)),
			chromedp.KeyEvent("?"), chromedp.WaitVisible(chromedp.CSS(`#keys`))); err != nil {
			t.Fatalf("%s: open the shortcuts: %v", scheme, err)
		}
		for _, f := range measureContrast(tctx, t, scheme+" shortcuts").Fails {
			t.Errorf("%s shortcuts: contrast %.2f:1 < 4.5:1 for <%s> %q (%s on %s)", scheme, f.Ratio, f.El, f.Text, f.Color, f.Bg)
		}
	}
	// The measure can fail: grey on grey is reported.
	if err := chromedp.Do(tctx, js(`const d = document.createElement('p'); d.textContent = 'faint'; d.style.color = '#777'; d.style.background = '#888'; document.querySelector('main').append(d)`)); err != nil {
		t.Fatal(err)
	}
	if r := measureContrast(tctx, t, "self-check"); len(r.Fails) != 1 || r.Fails[0].Text != "faint" {
		t.Errorf("grey on grey: failures %+v, want the one faint paragraph", r.Fails)
	}
	if p := console.problems(); len(p) > 0 {
		t.Fatalf("browser reported problems: %q", p)
	}
}

// The toggle pins light or dark over the system's preference, is
// remembered across a reload, and is applied before the body is parsed
// (so the page never flashes the other theme); "system" follows the
// system again.
func TestBrowserThemeToggleIsRemembered(t *testing.T) {
	h, _ := comfortHarness(t)
	ctx, console := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	// Record the theme at the moment <body> first exists, on every load.
	if err := chromedp.Do(tctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: `
			new MutationObserver(function (m, o) {
				if (!document.body) return;
				window.__themeAtBody = document.documentElement.dataset.theme || 'unset';
				o.disconnect();
			}).observe(document, {childList: true, subtree: true});`})
		return err
	}), colorScheme("light")); err != nil {
		t.Fatal(err)
	}
	browserLogin(tctx, t, h, "support")
	bodyLum := func() float64 {
		return measureContrast(tctx, t, "toggle").BodyLum
	}
	if l := bodyLum(); l < 0.5 {
		t.Fatalf("system light: page luminance %.3f, want light", l)
	}
	if err := chromedp.Do(tctx, chromedp.SetValue(chromedp.CSS(`#theme`), "dark"),
		js(`document.getElementById('theme').dispatchEvent(new Event('change'))`)); err != nil {
		t.Fatal(err)
	}
	waitJS(tctx, t, "dark pinned", `document.documentElement.dataset.theme === 'dark'`)
	if l := bodyLum(); l > 0.05 {
		t.Errorf("dark chosen on a light system: page luminance %.3f, want dark", l)
	}
	if err := chromedp.Do(tctx, chromedp.Navigate(h.base+"/outbox"), chromedp.WaitVisible(chromedp.CSS(`[data-testid="nav"]`))); err != nil {
		t.Fatal(err)
	}
	if got, err := chromedp.Run(tctx, chromedp.Evaluate[string](`window.__themeAtBody + '|' + document.getElementById('theme').value`)); err != nil || got != "dark|dark" {
		t.Errorf("after a reload: theme when the body appeared | toggle = %q (%v), want dark|dark", got, err)
	}
	if l := bodyLum(); l > 0.05 {
		t.Errorf("after a reload: page luminance %.3f, want dark", l)
	}
	// Back to the system: light again, and dark when the system is.
	if err := chromedp.Do(tctx, chromedp.SetValue(chromedp.CSS(`#theme`), "system"),
		js(`document.getElementById('theme').dispatchEvent(new Event('change'))`),
		chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`[data-testid="nav"]`))); err != nil {
		t.Fatal(err)
	}
	if got, err := chromedp.Run(tctx, chromedp.Evaluate[string](`window.__themeAtBody + '|' + String(localStorage.getItem('sluice.theme'))`)); err != nil || got != "unset|null" {
		t.Errorf("system: %q (%v), want unset|null", got, err)
	}
	if l := bodyLum(); l < 0.5 {
		t.Errorf("system light: page luminance %.3f, want light", l)
	}
	if err := chromedp.Do(tctx, colorScheme("dark")); err != nil {
		t.Fatal(err)
	}
	if l := bodyLum(); l > 0.05 {
		t.Errorf("system dark: page luminance %.3f, want dark", l)
	}
	if p := console.problems(); len(p) > 0 {
		t.Fatalf("browser reported problems: %q", p)
	}
}

// Times read in the browser's time zone, with a date when not today, and
// the UTC instant in the title; a fragment the live feed swaps in is
// localized too.
func TestBrowserTimesFollowTheTimeZone(t *testing.T) {
	h, s := comfortHarness(t)
	ctx, console := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := chromedp.Do(tctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, emulation.SetLocaleOverride, emulation.SetLocaleOverrideParams{Locale: "en_GB"})
		return err
	})); err != nil {
		t.Fatal(err)
	}
	browserLogin(tctx, t, h, "admin")
	type shown struct{ Text, Title, Datetime string }
	read := func(sel string) shown {
		t.Helper()
		waitJS(tctx, t, sel+" localized", `(() => { const e = document.querySelector('`+sel+`'); return !!e && e.dataset.shown === e.getAttribute('datetime'); })()`)
		raw, err := chromedp.Run(tctx, chromedp.Evaluate[string](`(() => { const e = document.querySelector('`+sel+`');
			return JSON.stringify({Text: e.textContent, Title: e.title, Datetime: e.getAttribute('datetime')}); })()`))
		if err != nil {
			t.Fatal(err)
		}
		var v shown
		if err := json.Unmarshal([]byte(raw), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	texts := map[string]string{}
	for _, zone := range []string{"Asia/Tokyo", "America/Los_Angeles"} {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		if err := chromedp.Do(tctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdp.Call(ctx, tg, emulation.SetTimezoneOverride, emulation.SetTimezoneOverrideParams{TimezoneID: zone})
			return err
		}), chromedp.Navigate(h.base+"/outbox/"+s.old), chromedp.WaitVisible(chromedp.CSS(`[data-testid="event-id"]`))); err != nil {
			t.Fatalf("%s: %v", zone, err)
		}
		// Created two days ago: a date and the time in this zone.
		created := read(`[data-testid="created"] time`)
		at, err := time.Parse(time.RFC3339Nano, created.Datetime)
		if err != nil {
			t.Fatalf("%s: datetime %q: %v", zone, created.Datetime, err)
		}
		local := at.In(loc)
		if want := at.UTC().Format("2006-01-02 15:04:05") + " UTC"; created.Title != want {
			t.Errorf("%s: title %q, want the UTC instant %q", zone, created.Title, want)
		}
		for _, part := range []string{local.Format("15:04:05"), local.Format("Jan"), strconv.Itoa(local.Day())} {
			if !strings.Contains(created.Text, part) {
				t.Errorf("%s: created shows %q, want it to contain %q (%s local)", zone, created.Text, part, local)
			}
		}
		if strings.Contains(created.Text, "UTC") {
			t.Errorf("%s: created still in UTC: %q", zone, created.Text)
		}
		texts[zone] = created.Text
		// Read just now: today, so the time without a date.
		readAt := read(`[data-testid="read-at"] time`)
		rt, _ := time.Parse(time.RFC3339Nano, readAt.Datetime)
		if !strings.Contains(readAt.Text, rt.In(loc).Format("15:04:05")) || strings.Contains(readAt.Text, rt.In(loc).Format("Jan")) {
			t.Errorf("%s: read at %q, want the local time %s without a date", zone, readAt.Text, rt.In(loc).Format("15:04:05"))
		}
	}
	if texts["Asia/Tokyo"] == texts["America/Los_Angeles"] {
		t.Errorf("the same instant reads %q in Tokyo and Los Angeles", texts["Asia/Tokyo"])
	}
	// The dashboard's "as of" is replaced by every push of the live feed:
	// the new one is localized as well.
	if err := chromedp.Do(tctx, chromedp.Navigate(h.base+"/"), chromedp.WaitVisible(chromedp.CSS(`[data-testid="nav"]`))); err != nil {
		t.Fatal(err)
	}
	first := read(`#updated time`)
	waitJS(tctx, t, "a pushed, localized 'as of'", fmt.Sprintf(`(() => { const e = document.querySelector('#updated time');
		return !!e && e.getAttribute('datetime') !== %q && e.dataset.shown === e.getAttribute('datetime') && !e.textContent.includes('UTC'); })()`, first.Datetime))
	if p := console.problems(); len(p) > 0 {
		t.Fatalf("browser reported problems: %q", p)
	}
}

// "?" lists the shortcuts (navigation only to the pages the role has), Esc
// closes the list, "g o" goes to the outbox, "/" focuses its filter, "j"
// moves to a row and "y" copies its id; the copy button copies with one
// click and says so.
func TestBrowserShortcutsAndCopy(t *testing.T) {
	h, s := comfortHarness(t)
	ctx, console := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for _, name := range []string{"clipboard-read", "clipboard-write"} {
		if _, err := cdp.Call(tctx, chromedp.FromContext(tctx).Browser, cdpbrowser.SetPermission, cdpbrowser.SetPermissionParams{
			Permission: &cdpbrowser.PermissionDescriptor{Name: name}, Setting: cdpbrowser.PermissionSettingGranted, Origin: h.base}); err != nil {
			t.Fatalf("grant %s: %v", name, err)
		}
	}
	keysListed := func() string {
		got, err := chromedp.Run(tctx, chromedp.Evaluate[string](`Array.from(document.querySelectorAll('#keys td:last-child')).map(e => e.textContent).join('|')`))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	// A viewer: no audit, jobs or approvals in the list.
	browserLogin(tctx, t, h, "support")
	waitJS(tctx, t, "the viewer's page loaded", `document.readyState === 'complete'`)
	if err := chromedp.Do(tctx, chromedp.KeyEvent("?"), chromedp.WaitVisible(chromedp.CSS(`#keys`))); err != nil {
		t.Fatalf("? opens the shortcuts: %v", err)
	}
	got := keysListed()
	for _, want := range []string{"go to Dashboard", "go to Outbox", "go to Payments", "copy the id"} {
		if !strings.Contains(got, want) {
			t.Errorf("viewer's shortcuts %q lack %q", got, want)
		}
	}
	for _, absent := range []string{"go to Audit", "go to Jobs", "go to Approvals"} {
		if strings.Contains(got, absent) {
			t.Errorf("viewer's shortcuts %q offer %q, a page the role cannot open", got, absent)
		}
	}
	if err := chromedp.Do(tctx, chromedp.KeyEvent(kb.Escape), chromedp.WaitNotVisible(chromedp.CSS(`#keys`))); err != nil {
		t.Fatalf("Esc closes the shortcuts: %v", err)
	}
	if err := chromedp.Do(tctx, chromedp.Click(chromedp.CSS(`[data-testid="logout"]`)), chromedp.WaitVisible(chromedp.CSS(`[data-testid="sign-in"]`))); err != nil {
		t.Fatal(err)
	}

	browserLogin(tctx, t, h, "admin")
	waitJS(tctx, t, "the admin's page loaded", `document.readyState === 'complete'`)
	if err := chromedp.Do(tctx, chromedp.KeyEvent("?"), chromedp.WaitVisible(chromedp.CSS(`#keys`))); err != nil {
		t.Fatal(err)
	}
	if got := keysListed(); !strings.Contains(got, "go to Audit") || !strings.Contains(got, "go to Jobs") {
		t.Errorf("admin's shortcuts %q lack the audit and jobs pages", got)
	}
	// "g" then a quote names no section (and must not break the page: the
	// console log is checked at the end), then "g o" opens the outbox.
	if err := chromedp.Do(tctx, chromedp.KeyEvent(kb.Escape), chromedp.WaitNotVisible(chromedp.CSS(`#keys`)),
		chromedp.KeyEvent("g"), chromedp.KeyEvent(`"`), chromedp.KeyEvent("g"), chromedp.KeyEvent("o")); err != nil {
		t.Fatal(err)
	}
	// Complete: console.js (deferred) has run and listens for keys; a key
	// sent while the new page is still loading goes nowhere.
	waitJS(tctx, t, "g o opened the outbox", `location.pathname === '/outbox' && !!document.querySelector('[data-testid="filters"]') && document.readyState === 'complete'`)
	if err := chromedp.Do(tctx, chromedp.KeyEvent("/")); err != nil {
		t.Fatal(err)
	}
	waitJS(tctx, t, "/ focused the filter", `document.activeElement && document.activeElement.closest('[data-testid="filters"]') !== null`)
	// Leave the filter, then j to the first row and y to copy its id.
	if err := chromedp.Do(tctx, js(`document.activeElement.blur()`), chromedp.KeyEvent("j"), chromedp.KeyEvent("y")); err != nil {
		t.Fatal(err)
	}
	firstID, err := chromedp.Run(tctx, chromedp.Evaluate[string](`document.querySelector('[data-testid="row"]').dataset.id`))
	if err != nil {
		t.Fatal(err)
	}
	waitJS(tctx, t, "y marked the row's copy button", `document.querySelector('[data-testid="row"] [data-testid="copy-id"]').dataset.copied === 'yes'`)
	clip := func() string {
		got, err := chromedp.Run(tctx, chromedp.Evaluate[string](`navigator.clipboard.readText()`, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("read the clipboard: %v", err)
		}
		return got
	}
	if got := clip(); got != firstID {
		t.Errorf("j then y copied %q, want the first row's id %s", got, firstID)
	}
	// One click on the event page's copy button.
	if err := chromedp.Do(tctx, chromedp.Navigate(h.base+"/outbox/"+s.dead), chromedp.WaitVisible(chromedp.CSS(`[data-testid="event-id"]`)),
		chromedp.Click(chromedp.CSS(`h1 [data-testid="copy-id"]`))); err != nil {
		t.Fatal(err)
	}
	waitJS(tctx, t, "the button says copied", `document.querySelector('h1 [data-testid="copy-id"]').dataset.copied === 'yes'`)
	if got := clip(); got != s.dead {
		t.Errorf("the copy button copied %q, want %s", got, s.dead)
	}
	if got := text(tctx, t, `#announce`); got != "Copied "+s.dead {
		t.Errorf("announced %q", got)
	}
	label, err := chromedp.Run(tctx, chromedp.Evaluate[string](`document.querySelector('h1 [data-testid="copy-id"]').getAttribute('aria-label')`))
	if err != nil || label != "Copy "+s.dead {
		t.Errorf("copy button label %q (%v)", label, err)
	}
	if p := console.problems(); len(p) > 0 {
		t.Fatalf("browser reported problems: %q", p)
	}
}
