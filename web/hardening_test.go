package web_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-dev/sluice/internal/outbox/outboxtest"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// smallSendBuffers gives every accepted connection a tiny kernel send
// buffer (SO_SNDBUF also turns off autotuning), so a client that never
// reads fills the path quickly and deterministically.
type smallSendBuffers struct{ net.Listener }

func (l smallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetWriteBuffer(4 << 10)
		}
	}
	return c, err
}

// SECURITY.md case 15 with real sockets: a websocket client that never
// reads is dropped by the hub while a client that reads keeps receiving,
// and the hub's buffers never hold more than their bound.
func TestWebsocketClientThatNeverReadsIsDropped(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: time.Hour, wrap: func(l net.Listener) net.Listener { return smallSendBuffers{l} }})
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	feed := h.app.Feed()

	fast, _, err := h.dial(t, b, h.base)
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Close()
	var (
		fastFrames atomic.Int64
		mu         sync.Mutex
		frames     []string // every frame the fast client read, in order
	)
	go func() {
		for {
			_, msg, err := fast.ReadMessage()
			if err != nil {
				return
			}
			mu.Lock()
			frames = append(frames, string(msg))
			mu.Unlock()
			fastFrames.Add(1)
		}
	}()

	// The slow client: a tiny receive buffer, and it never reads.
	d := websocket.Dialer{HandshakeTimeout: 10 * time.Second, Jar: b.Jar,
		NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err == nil {
				_ = c.(*net.TCPConn).SetReadBuffer(4 << 10)
			}
			return c, err
		}}
	slow, _, err := d.Dial("ws"+strings.TrimPrefix(h.base, "http")+"/ws", http.Header{"Origin": {h.base}})
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	testkit.Eventually(t, "both sockets subscribed", func() (bool, error) { return feed.Clients() == 2, nil })

	const clientBuffer = 8 // live.Config.ClientBuffer's default, used by the console
	ctx := context.Background()
	steps := 0
	for feed.Dropped() == 0 {
		if steps == 2000 {
			t.Fatalf("the client that never reads was not dropped after %d changed ticks", steps)
		}
		steps++
		// Each step changes the page (one more pending event), so every
		// subscribed client gets a frame. Waiting for the fast client's
		// frame keeps it from ever falling behind, however loaded the
		// machine is.
		before := fastFrames.Load()
		insertEvent(t, h, "slowtest")
		if err := feed.Step(ctx); err != nil {
			t.Fatal(err)
		}
		if q := feed.Queued(); q > 2*clientBuffer {
			t.Fatalf("the hub holds %d messages for 2 clients: unbounded", q)
		}
		testkit.Eventually(t, "the fast client's frame", func() (bool, error) { return fastFrames.Load() > before, nil })
	}
	t.Logf("slow client dropped after %d changed ticks", steps)
	if feed.Dropped() != 1 || feed.Clients() != 1 {
		t.Fatalf("dropped %d, clients %d: want the slow one dropped, the fast one kept", feed.Dropped(), feed.Clients())
	}
	// The fast client still gets every change.
	before := fastFrames.Load()
	insertEvent(t, h, "afterdrop")
	if err := feed.Step(ctx); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the fast client sees the next change", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		// Any frame since the change: the running feed may step again (a
		// wake-up) and send a later frame (a new "as of" time) before this
		// check reads, and unchanged fragments are never sent again, so the
		// last frame alone may not carry the new topic (seen under load).
		for _, f := range frames[before:] {
			if strings.Contains(f, ">afterdrop</span>") {
				return true, nil
			}
		}
		return false, nil
	})
	if feed.Dropped() != 1 || feed.Clients() != 1 {
		t.Fatalf("after the drop: dropped %d, clients %d", feed.Dropped(), feed.Clients())
	}
}

// A frame larger than the read limit ends the socket (the dashboard sends
// nothing, so a big frame is an attack on memory).
func TestWebsocketReadLimit(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: time.Hour})
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	c, _, err := h.dial(t, b, h.base)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testkit.Eventually(t, "socket subscribed", func() (bool, error) { return h.app.Feed().Clients() == 1, nil })
	// The server may close while the frame is still being written: a write
	// error is fine, what matters is that the socket ends.
	_ = c.WriteMessage(websocket.TextMessage, make([]byte, 64<<10))
	testkit.Eventually(t, "the oversized frame ends the socket", func() (bool, error) { return h.app.Feed().Clients() == 0, nil })
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		if _, _, err = c.ReadMessage(); err != nil {
			break
		}
	}
	var ce *websocket.CloseError
	if errors.As(err, &ce) && ce.Code != websocket.CloseMessageTooBig {
		t.Fatalf("closed with %d, want 1009", ce.Code)
	}
}

// METRICS_ADDR: /metrics is served on its own listener (and nothing else
// is), and it leaves the console's listener.
func TestMetricsOnSeparateListener(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 100 * time.Millisecond, metrics: true})
	insertEvent(t, h, "ledger")
	b := newBrowser(t)
	testkit.Eventually(t, "backlog gauge on the metrics listener", func() (bool, error) {
		resp, body := b.get(t, h.metrics+"/metrics", "")
		return resp.StatusCode == http.StatusOK && strings.Contains(body, `sluice_outbox_backlog{topic="ledger"} 1`), nil
	})
	if resp, body := b.get(t, h.base+"/metrics", ""); resp.StatusCode != http.StatusNotFound || strings.Contains(body, "sluice_") {
		t.Fatalf("/metrics on the console's listener: %d", resp.StatusCode)
	}
	for _, p := range []string{"/", "/login", "/ws", "/healthz", "/metrics/x"} {
		if resp, _ := b.noRedirects().Get(h.metrics + p); resp.StatusCode != http.StatusNotFound {
			t.Errorf("metrics listener answers %s with %d", p, resp.StatusCode)
		}
	}
	if resp, _ := b.get(t, h.base+"/healthz", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz on the console's listener: %d", resp.StatusCode)
	}
}

// Default deny: every registered route (read from echo itself, not from the
// route table) refuses an anonymous caller, except the few public ones.
func TestEveryRouteRefusesAnonymous(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	public := map[string]bool{
		"GET /healthz": true, "GET /readyz": true, "GET /static/*": true, "GET /login": true,
		"GET /auth/callback": true, "GET /signed-out": true, "GET /metrics": true,
	}
	c := newBrowser(t).noRedirects()
	routes := h.app.Routes()
	if len(routes) < len(public) {
		t.Fatalf("routes %v", routes)
	}
	for _, r := range routes {
		method, path, _ := strings.Cut(r, " ")
		if public[r] {
			continue
		}
		req, _ := http.NewRequest(method, h.base+strings.ReplaceAll(path, "*", "x"), strings.NewReader(""))
		req.Header.Set("Accept", "text/html")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		loc := resp.Header.Get("Location")
		refused := resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden ||
			resp.StatusCode == http.StatusSeeOther && strings.HasPrefix(loc, "/login?")
		if !refused {
			t.Errorf("anonymous %s: %d %s", r, resp.StatusCode, loc)
		}
	}
}

// Every refusal is audited with who and where from (ip, user agent, request
// id, session hash) but never the session id or the CSRF token; a crafted
// User-Agent (invalid UTF-8, longer than the limit) cannot make the audit
// fail and so turn the 403 into an unaudited 500.
func TestDenialAuditCarriesContextButNoSecrets(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b := newBrowser(t)
	_, body := h.login(t, b, "oncall", "oncall", "")
	token := csrfField.FindStringSubmatch(body)[1]
	sid := b.sessionCookie(h.base)
	long := "a" + strings.Repeat("é", 300) // byte 512 falls inside a character
	stored := map[string]string{
		"test-agent/1.0":     "test-agent/1.0",
		"evil\xff\xfe-agent": "evil\uFFFD-agent",
		long:                 "a" + strings.Repeat("é", 255), // cut on a rune boundary, not mangled
	}
	for ua, want := range stored {
		req, _ := http.NewRequest(http.MethodPost, h.base+"/logout", strings.NewReader(url.Values{"csrf_token": {token + "x"}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("User-Agent", ua)
		resp, err := b.noRedirects().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("UA %.20q: %d, want 403", ua, resp.StatusCode)
		}
		rid := resp.Header.Get("X-Request-Id")
		var ip, gotUA, sessHash, target, actor string
		err = h.pool.QueryRow(context.Background(), `
			SELECT ip, user_agent, session_hash, target_id, actor_sub FROM audit_event
			WHERE action = 'request.denied' AND error_code = 'csrf' AND request_id = $1`, rid).
			Scan(&ip, &gotUA, &sessHash, &target, &actor)
		if err != nil {
			t.Fatalf("UA %.20q: denial with request id %q not audited: %v", ua, rid, err)
		}
		sum := sha256.Sum256([]byte(sid))
		if ip != "127.0.0.1" || gotUA != want || sessHash != hex.EncodeToString(sum[:]) || target != "POST /logout" || actor != "user-oncall" && actor != "demo-oncall" {
			t.Errorf("audit row: ip %q ua %q session %q target %q actor %q", ip, gotUA, sessHash, target, actor)
		}
	}
	if n := h.countAudit(t, `strpos(audit_event::text, $1) > 0 OR strpos(audit_event::text, $2) > 0`, sid, token); n != 0 {
		t.Fatalf("%d audit rows carry the session id or the CSRF token", n)
	}
}

// A cross-origin refusal is answered outside echo: it still carries the
// security headers, and its refusal-log row (no session: not the chain)
// names the route template, not the raw path.
func TestCrossOriginRefusalHeadersAndAudit(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	c := newBrowser(t).noRedirects()
	for path, route := range map[string]string{
		"/logout?x=1":                          "POST /logout",
		"/no/such/" + strings.Repeat("a", 300): "POST unmatched",
	} {
		req, _ := http.NewRequest(http.MethodPost, h.base+path, nil)
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("%s: %d", path, resp.StatusCode)
		}
		hd := resp.Header
		if !strings.Contains(hd.Get("Content-Security-Policy"), "frame-ancestors 'none'") || hd.Get("X-Content-Type-Options") != "nosniff" ||
			hd.Get("Referrer-Policy") != "same-origin" || hd.Get("Cache-Control") != "no-store" || hd.Get("X-Request-Id") == "" {
			t.Errorf("%s: headers %v", path, hd)
		}
		if h.countRefusals(t, `reason = 'cross_origin' AND route = $1 AND request_id = $2 AND ip = '127.0.0.1'`, route, hd.Get("X-Request-Id")) != 1 {
			t.Errorf("%s: refusal not logged as %q", path, route)
		}
	}
	if n := h.countAudit(t, `true`); n != 0 {
		t.Errorf("anonymous cross-origin refusals made %d chain rows", n)
	}
}

// Bodies are limited before the guard reads a form: an oversized POST is
// refused with 413 and changes nothing, even with a valid token.
func TestOversizedBodyIsRefused(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b := newBrowser(t)
	_, body := h.login(t, b, "oncall", "oncall", "")
	token := csrfField.FindStringSubmatch(body)[1]
	form := url.Values{"csrf_token": {token}, "pad": {strings.Repeat("x", 128<<10)}}.Encode()
	req, _ := http.NewRequest(http.MethodPost, h.base+"/logout", strings.NewReader(form))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := b.noRedirects().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized POST: %d, want 413", resp.StatusCode)
	}
	if r, _ := b.get(t, h.base+"/", "text/html"); r.StatusCode != http.StatusOK || r.Request.URL.Path != "/" {
		t.Fatal("the oversized POST ended the session")
	}
}

// SECURITY.md case 6 on the dashboard: topic and event type are producer
// data; markup in them stays inert text on the page and in websocket
// frames.
func TestDashboardRendersAttackerTextInert(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 100 * time.Millisecond})
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	conn, _, err := h.dial(t, b, h.base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const (
		topic = `<script>alert(1)</script>`
		etype = `" onmouseover="alert(2)" hx-get="/logout`
	)
	outboxtest.Insert(t, h.pool, outboxtest.Seed{Topic: topic, EventType: etype})
	// the error text is attacker-reachable too (a broker echoes what it refused)
	outboxtest.Insert(t, h.pool, outboxtest.Seed{Topic: topic, EventType: etype, Status: "dead", Attempts: 9, LastError: topic + etype})
	var frames strings.Builder
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(frames.String(), "onmouseover") || !strings.Contains(frames.String(), "&lt;script&gt;") ||
		!strings.Contains(frames.String(), `data-testid="dead-error"`) {
		_ = conn.SetReadDeadline(deadline)
		_, msg, err := conn.ReadMessage()
		if err != nil {
			t.Fatalf("the planted rows never showed: %v", err)
		}
		frames.Write(msg)
	}
	_, page := b.get(t, h.base+"/", "text/html")
	for name, html := range map[string]string{"page": page, "frames": frames.String()} {
		assertInert(t, name, html)
		d := doc(t, html)
		if !strings.Contains(d.Text(), topic) || !strings.Contains(d.Text(), etype) {
			t.Errorf("%s: the text is not shown as text", name)
		}
	}
}
