package web_test

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/gorilla/websocket"

	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
	"github.com/sluice-dev/sluice/internal/testkit"
	"github.com/sluice-dev/sluice/web"
)

// frames reads a socket's frames into a channel until it closes.
func frames(t *testing.T, conn *websocket.Conn) <-chan string {
	t.Helper()
	ch := make(chan string, 64)
	go func() {
		defer close(ch)
		for {
			_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
			_, msg, err := conn.ReadMessage()
			if err != nil {
				return
			}
			ch <- string(msg)
		}
	}()
	return ch
}

// quiet waits for n ticks of the feed, and a moment for the last tick's
// frame to cross the socket, and fails if a frame came meanwhile.
func (h *harness) quiet(t *testing.T, ch <-chan string, n int64, why string) {
	t.Helper()
	_, t0 := h.app.Feed().Stats()
	testkit.Eventually(t, "ticks", func() (bool, error) { _, t1 := h.app.Feed().Stats(); return t1 >= t0+n, nil })
	select {
	case f := <-ch:
		t.Fatalf("%s, yet the page got a frame: %.400s", why, f)
	case <-time.After(300 * time.Millisecond):
	}
}

// notice waits for the record notice that says all of want.
func notice(t *testing.T, ch <-chan string, want ...string) string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case f, ok := <-ch:
			if !ok {
				t.Fatal("the socket ended before the notice")
			}
			d := doc(t, f)
			if other := d.Find(`[hx-swap-oob]:not(#record-changed)`); other.Length() > 0 {
				t.Fatalf("a detail page got another fragment: %.400s", f)
			}
			n := d.Find(`#record-changed[hx-swap-oob][role="status"]`)
			text := strings.Join(strings.Fields(n.Text()), " ")
			all := n.Length() == 1 && n.Find(`[data-testid="reload"]`).Length() == 1
			for _, w := range want {
				all = all && strings.Contains(text, w)
			}
			if all {
				return text
			}
		case <-deadline:
			t.Fatalf("no notice saying %q", want)
		}
	}
}

// openLive opens a page as b and its socket.
func (h *harness) openLive(t *testing.T, b *browser, path string) (string, <-chan string) {
	t.Helper()
	resp, body := b.get(t, h.base+path, "text/html")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d", path, resp.StatusCode)
	}
	ws := doc(t, body).Find(`[ws-connect]`).AttrOr("ws-connect", "")
	if q, err := url.ParseQuery(strings.TrimPrefix(ws, "/ws?")); err != nil || !strings.HasPrefix(ws, "/ws?") || q.Get("page") != live.PageRecord {
		t.Fatalf("%s: ws-connect %q", path, ws)
	}
	conn, err := h.dialPath(t, b, ws)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return ws, frames(t, conn)
}

// An event's page hears about its event alone: another event retried, a new
// dead letter elsewhere (the outbox moving, which the page used to report)
// say nothing; a colleague retrying this one says so, in the page's words.
func TestEventPageHearsAboutItsEventOnly(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 100 * time.Millisecond})
	dead := plant(t, h, planted{status: "dead", attempts: 3, lastError: "nats: no responders"})
	other := plant(t, h, planted{status: "dead", attempts: 5})
	support := newBrowser(t)
	h.login(t, support, "support", "support", "")
	_, ch := h.openLive(t, support, "/outbox/"+dead.String())
	testkit.Eventually(t, "the socket watches the event", func() (bool, error) {
		_, watched, _ := h.app.Feed().WatchStats()
		return watched[live.KindEvent] == 1, nil
	})
	h.quiet(t, ch, 3, "nothing changed")

	oncall, token := h.signedIn(t, "oncall")
	if resp, _ := h.postForm(t, oncall, "/outbox/"+other.String()+"/retry", url.Values{"csrf_token": {token}, "expected": {"dead"}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("retry the other event: %d", resp.StatusCode)
	}
	plant(t, h, planted{status: "dead"})
	h.quiet(t, ch, 5, "only other events changed")

	if resp, _ := h.postForm(t, oncall, "/outbox/"+dead.String()+"/retry", url.Values{"csrf_token": {token}, "expected": {"dead"}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("retry the event: %d", resp.StatusCode)
	}
	text := notice(t, ch, "This event changed since this page loaded: status dead → pending", "attempts 3 → 0", "Reload to see it.")
	if strings.Contains(text, "dead letters") || strings.Contains(text, "outbox") {
		t.Fatalf("the event's notice speaks of the outbox: %q", text)
	}
	// Said once: the next ticks push nothing while the event stays so.
	h.quiet(t, ch, 3, "the notice was pushed")
}

// A published event's page is live too: replayed elsewhere, then published
// again by a relay, the page says so.
func TestPublishedEventPageHearsItsPublication(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 100 * time.Millisecond})
	ev := plant(t, h, planted{status: "pending", attempts: 2})
	support := newBrowser(t)
	h.login(t, support, "support", "support", "")
	_, ch := h.openLive(t, support, "/outbox/"+ev.String())
	h.quiet(t, ch, 2, "nothing changed")
	// A relay publishes it (as outbox's mark does: one statement).
	if _, err := h.pool.Exec(context.Background(), `UPDATE outbox_event SET status = 'published', published_at = now(), attempts = attempts + 1 WHERE id = $1`, ev); err != nil {
		t.Fatal(err)
	}
	notice(t, ch, "changed since this page loaded: published, attempts 2 → 3.")
}

// A payment's page hears that a colleague resolved it, without a reload,
// and nothing when another payment is resolved. Neither the page's socket
// URL nor a frame carries customer data or the amount.
func TestPaymentPageHearsAColleaguesResolution(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 100 * time.Millisecond})
	customer := map[string]string{"name": "CANARY-NAME", "email": "canary@example.com"}
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "42.42", Customer: customer})
	other, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "17.00"})
	support := newBrowser(t)
	h.login(t, support, "support", "support", "")
	ws, ch := h.openLive(t, support, "/payments/"+op.String())
	testkit.Eventually(t, "the socket watches the payment", func() (bool, error) {
		_, watched, _ := h.app.Feed().WatchStats()
		return watched[live.KindPayment] == 1, nil
	})
	h.quiet(t, ch, 3, "nothing changed")

	oncall, token := h.signedIn(t, "oncall")
	if resp, _ := h.postForm(t, oncall, "/payments/"+other.String()+"/resolve", resolveForm(token, "failed")); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("resolve the other payment: %d", resp.StatusCode)
	}
	h.quiet(t, ch, 5, "only another payment changed")

	if resp, _ := h.postForm(t, oncall, "/payments/"+op.String()+"/resolve", resolveForm(token, "succeeded")); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("resolve: %d", resp.StatusCode)
	}
	text := notice(t, ch, "This payment changed since this page loaded: status unknown → completed, resolved by an operator.")
	for _, where := range []string{ws, text} {
		low := strings.ToLower(where)
		if strings.Contains(low, "canary") || strings.Contains(low, "42.42") || strings.Contains(low, "oncall") {
			t.Fatalf("customer or staff data in %q", where)
		}
	}
}

// N sockets watching M records cost one statement per tick besides the
// snapshot, counted at the console's querier, whatever N and M.
func TestRecordSocketsCostOneStatementPerTick(t *testing.T) {
	t.Parallel()
	const perRecord = 4
	h := start(t, options{tick: 100 * time.Millisecond, configure: func(c *web.Config) { c.WSPerSession = 40 }})
	var paths []string
	for range 3 {
		paths = append(paths, "/outbox/"+plant(t, h, planted{status: "dead"}).String())
	}
	for range 2 {
		op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{})
		paths = append(paths, "/payments/"+op.String())
	}
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	var wg sync.WaitGroup
	for _, p := range paths {
		for range perRecord {
			wg.Go(func() { h.openLive(t, b, p) })
		}
	}
	wg.Wait()
	testkit.Eventually(t, "every socket subscribed", func() (bool, error) { return h.app.Feed().Clients() == len(paths)*perRecord, nil })
	_, watched, refused := h.app.Feed().WatchStats()
	if watched[live.KindEvent] != 3 || watched[live.KindPayment] != 2 || refused != 0 {
		t.Fatalf("watched %v, refused %d", watched, refused)
	}
	_, ticks0 := h.app.Feed().Stats()
	q0, _, _ := h.app.Feed().WatchStats()
	count0 := h.counter.n.Load()
	testkit.Eventually(t, "ten ticks", func() (bool, error) { _, t1 := h.app.Feed().Stats(); return t1 >= ticks0+10, nil })
	_, ticks1 := h.app.Feed().Stats()
	q1, _, _ := h.app.Feed().WatchStats()
	ticks, statements, records := ticks1-ticks0, h.counter.n.Load()-count0, q1-q0
	// A tick may be in flight at either end of the window.
	if statements < 2*ticks-2 || statements > 2*ticks+2 || records < ticks-1 || records > ticks+1 {
		t.Fatalf("%d statements (%d of records) for %d ticks with %d sockets on %d records: want the snapshot and one read of the records per tick",
			statements, records, ticks, len(paths)*perRecord, len(paths))
	}
}

// A hostile mark, an oversized one, an unknown kind or an id that is no
// UUID: the socket opens (its checks are the page's), watches nothing and
// hears nothing, and the feed reads no record for it.
func TestHostileRecordSocketsWatchNothing(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 100 * time.Millisecond, configure: func(c *web.Config) { c.WSPerSession = 10 }})
	dead := plant(t, h, planted{status: "dead", attempts: 3})
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	at := strconv.FormatInt(time.Now().Add(-time.Minute).UnixMicro(), 10)
	var chans []<-chan string
	for _, q := range []url.Values{
		{"since": {"dead.3.0.-." + strings.Repeat("9", 20000)}},
		{"since": {"dead.3.0.<script>alert(1)</script>.-"}},
		{"since": {"dead.3.0.-.-"}, "kind": {"audit_event"}},
		{"since": {"dead.3.0.-.-"}, "id": {dead.String() + "' OR 1=1"}},
		{"since": {"dead.3.0.-.-"}, "at": {"-1"}},
	} {
		v := url.Values{"page": {live.PageRecord}, "kind": {live.KindEvent}, "id": {dead.String()}, "at": {at}}
		for k, vs := range q {
			v[k] = vs
		}
		conn, err := h.dialPath(t, b, "/ws?"+v.Encode())
		if err != nil {
			t.Fatalf("%v: %v", q, err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		chans = append(chans, frames(t, conn))
	}
	testkit.Eventually(t, "the sockets subscribed", func() (bool, error) { return h.app.Feed().Clients() == 5, nil })
	if q, watched, _ := h.app.Feed().WatchStats(); watched[live.KindEvent] != 0 || q != 0 {
		t.Fatalf("hostile marks watch %v (%d reads)", watched, q)
	}
	if _, err := h.pool.Exec(context.Background(), `UPDATE outbox_event SET status = 'pending', dead_at = NULL, attempts = 0 WHERE id = $1`, dead); err != nil {
		t.Fatal(err)
	}
	for _, ch := range chans {
		h.quiet(t, ch, 3, "a hostile mark watches nothing")
	}
	// The page itself still works for the same user.
	_, ch := h.openLive(t, b, "/outbox/"+dead.String())
	h.quiet(t, ch, 2, "nothing changed since the page")
}

// In a real browser: on-call types a reason and evidence on an unknown
// payment's page; a colleague resolves it meanwhile; the page says so in
// its status notice, and the half-filled form is still there, untouched.
func TestBrowserPaymentPageHearsAResolutionAndKeepsTheForm(t *testing.T) {
	h := start(t, options{tick: 100 * time.Millisecond})
	op, _ := h.unknownPayment(t, paymentstest.PaymentOpts{Amount: "20.00"})
	ctx, console := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	browserLogin(tctx, t, h, "oncall")
	const reason, evidence = "the provider's portal shows the charge", "ticket PRV-4242"
	if err := chromedp.Do(tctx,
		chromedp.Navigate(h.base+"/payments/"+op.String()),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="reason"]`)),
		chromedp.Click(chromedp.CSS(`[data-testid="outcome-succeeded"]`)),
		chromedp.SendKeys(chromedp.CSS(`[data-testid="reason"]`), reason),
		chromedp.SendKeys(chromedp.CSS(`[data-testid="evidence"]`), evidence),
	); err != nil {
		t.Fatalf("fill the form: %v", err)
	}
	waitJS(tctx, t, "the payment page is live", `document.getElementById('conn').dataset.state === 'open'`)
	if _, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`(window.formAtLoad = document.querySelector('[data-testid="form-resolve"]')) !== null`)); err != nil {
		t.Fatal(err)
	}

	admin, token := h.signedIn(t, "admin")
	if resp, _ := h.postForm(t, admin, "/payments/"+op.String()+"/resolve", resolveForm(token, "failed")); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the colleague's resolve: %d", resp.StatusCode)
	}
	waitJS(tctx, t, "the notice", `(function(){var n=document.querySelector('#record-changed[role="status"] [data-testid="record-changes"]');
		return n !== null && document.getElementById('record-changed').textContent.indexOf('status unknown → failed') >= 0})()`)
	kept, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`document.querySelector('[data-testid="form-resolve"]') === window.formAtLoad
		&& document.querySelector('[data-testid="reason"]').value === `+strconv.Quote(reason)+`
		&& document.querySelector('[data-testid="evidence"]').value === `+strconv.Quote(evidence)+`
		&& document.querySelector('[data-testid="outcome-succeeded"]').checked`))
	if err != nil || !kept {
		t.Fatalf("the half-filled form was replaced or emptied (%v)", err)
	}
	if p := console.problems(); len(p) > 0 {
		t.Fatalf("browser reported problems: %q", p)
	}
	if png, err := chromedp.Run(tctx, chromedp.CaptureScreenshot()); err == nil {
		_ = os.WriteFile("/tmp/payment-record-notice.png", png, 0o644)
	}
}
