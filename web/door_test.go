package web_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/demo/devoidc"
	"github.com/sluice-dev/sluice/internal/testkit"
	"github.com/sluice-dev/sluice/web"
)

// series is the set of series a /metrics page exposes (name and labels,
// without values), sorted.
func series(t *testing.T, b *browser, u string) []string {
	t.Helper()
	resp, body := b.get(t, u, "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d", resp.StatusCode)
	}
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if i := strings.LastIndexByte(l, ' '); i > 0 {
			out = append(out, l[:i])
		}
	}
	slices.Sort(out)
	return out
}

// Issue 8.7: invented methods are answered 501 before any metric counts
// them, so /metrics keeps exactly the same series, and the methods that
// are counted carry a label from a fixed set.
func TestInventedMethodsLeaveMetricsAlone(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b := newBrowser(t)
	testkit.Eventually(t, "the first snapshot (its gauges are series too)", func() (bool, error) {
		_, ok := h.app.Feed().Latest()
		return ok, nil
	})
	series(t, b, h.base+"/metrics") // the scrape itself is a series from now on
	before := series(t, b, h.base+"/metrics")
	if !slices.ContainsFunc(before, func(s string) bool {
		return strings.HasPrefix(s, `sluice_http_request_duration_seconds_count{code="200",method="GET",route="/metrics"}`)
	}) {
		t.Fatalf("the request metric is missing: %v", before)
	}
	paths := []string{"/", "/login", "/metrics", "/ws", "/no/such/page", "/logout"}
	for i := 0; i < 1000; i++ {
		req, _ := http.NewRequest(fmt.Sprintf("INVENTED%d", i), h.base+paths[i%len(paths)], nil)
		resp, err := b.noRedirects().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotImplemented {
			t.Fatalf("method %s: %d, want 501", req.Method, resp.StatusCode)
		}
		if i == 0 && resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("the 501 lacks the security headers: %v", resp.Header)
		}
	}
	after := series(t, b, h.base+"/metrics")
	if !slices.Equal(before, after) {
		t.Fatalf("1000 invented methods changed the series:\nbefore %d: %v\nafter %d: %v", len(before), before, len(after), after)
	}
	if n := h.countAudit(t, `true`); n != 0 {
		t.Fatalf("invented methods wrote %d audit rows", n)
	}
	// A known method is labelled as itself.
	req, _ := http.NewRequest(http.MethodPut, h.base+"/", nil)
	resp, err := b.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := series(t, b, h.base+"/metrics"); !slices.ContainsFunc(got, func(s string) bool {
		return strings.Contains(s, `method="PUT"`)
	}) {
		t.Fatalf("PUT is not labelled as PUT: %v", got)
	}
}

// Issue 8.10: connections that trickle a body or headers, or idle, are
// closed by the server; an open websocket keeps working meanwhile.
func TestSlowAndIdleConnectionsAreClosed(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 100 * time.Millisecond, configure: func(c *web.Config) {
		c.ReadHeaderTimeout, c.ReadTimeout, c.IdleTimeout = time.Second, time.Second, time.Second
	}})
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	ws, _, err := h.dial(t, b, h.base)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	addr := strings.TrimPrefix(h.base, "http://")

	var closed atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	defer func() { close(stop); wg.Wait() }()
	// open dials, sends first, then keeps writing trickle (when set) one
	// byte every 100ms; closed counts when the server ends the connection
	// (the read side sees EOF or a reset).
	open := func(first, trickle string) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(c, first); err != nil {
			t.Fatal(err)
		}
		wg.Add(2)
		done := make(chan struct{})
		go func() {
			defer wg.Done()
			defer close(done)
			_, _ = io.Copy(io.Discard, c) // returns when the server closes
			closed.Add(1)
		}()
		go func() {
			defer wg.Done()
			defer c.Close()
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-done:
					return
				case <-tick.C:
					if trickle != "" {
						if _, err := io.WriteString(c, trickle); err != nil {
							<-done
							return
						}
					}
				}
			}
		}()
	}
	const each = 10
	for i := 0; i < each; i++ {
		// A body that never ends, to a route that reads it and to one that does not.
		open("POST /logout HTTP/1.1\r\nHost: "+addr+"\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\ncsrf_token=", "a")
		open("POST /no/such HTTP/1.1\r\nHost: "+addr+"\r\nContent-Length: 100000\r\n\r\n", "a")
		// Headers that never end.
		open("GET / HTTP/1.1\r\nHost: "+addr+"\r\n", "X")
		// A kept-alive connection after one complete request, then nothing.
		open("GET /healthz HTTP/1.1\r\nHost: "+addr+"\r\n\r\n", "")
	}
	testkit.Eventually(t, "the server closes every slow or idle connection", func() (bool, error) {
		return closed.Load() == 4*each, fmt.Errorf("%d of %d closed", closed.Load(), 4*each)
	})
	// More than every timeout has passed: the websocket still delivers.
	insertEvent(t, h, "stillalive")
	deadline := time.Now().Add(30 * time.Second)
	for {
		_ = ws.SetReadDeadline(deadline)
		_, msg, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("the websocket died with the slow connections: %v", err)
		}
		if strings.Contains(string(msg), ">stillalive<") {
			break
		}
	}
}

// Issue 8.10: invalid UTF-8 in next is no path: the login starts and goes
// back to / (it used to reach PostgreSQL and answer 500).
func TestLoginNextWithInvalidUTF8(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	resp, err := newBrowser(t).noRedirects().Get(h.base + "/login?next=/%ff")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound {
		t.Fatalf("GET /login?next=/%%ff: %d", resp.StatusCode)
	}
	var next string
	if err := h.pool.QueryRow(context.Background(), `SELECT next_path FROM console_login`).Scan(&next); err != nil || next != "/" {
		t.Fatalf("stored next %q (%v), want /", next, err)
	}
}

// Issue 8.10: a user whose group is removed at the provider loses the
// console at the next re-check: the request is refused, the session row
// and its websockets end, and the end is audited. A changed group changes
// the role the same way.
func TestRoleRemovedAtProviderEndsSession(t *testing.T) {
	t.Parallel()
	clock := testkit.NewClock(time.Now())
	h := start(t, options{clock: clock.Now, recheck: time.Hour, configure: func(c *web.Config) { c.RoleRecheck = 5 * time.Minute }})
	h.idp.AddUser("temp", "temp", "oncall")
	b := newBrowser(t)
	if resp, _ := h.login(t, b, "temp", "temp", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	role := func() (int, string) {
		resp, body := b.get(t, h.base+"/", "text/html")
		return resp.StatusCode, doc(t, body).Find(`[data-testid="role"]`).Text()
	}
	if code, r := role(); code != 200 || r != "operator" {
		t.Fatalf("before: %d %q", code, r)
	}
	// Past the interval with the group unchanged: the refresh keeps the session.
	clock.Advance(6 * time.Minute)
	if code, r := role(); code != 200 || r != "operator" {
		t.Fatalf("re-check with the group kept: %d %q", code, r)
	}
	// The group changes at the provider: the role follows at the next re-check.
	h.idp.SetGroups("temp", "support")
	clock.Advance(6 * time.Minute)
	if code, r := role(); code != 200 || r != "viewer" {
		t.Fatalf("re-check after the group changed: %d %q", code, r)
	}
	if h.countAudit(t, `action = 'auth.role_recheck' AND outcome = 'ok' AND actor_sub = 'user-temp'`) != 1 {
		t.Fatal("the role change is not audited")
	}
	ws, _, err := h.dial(t, b, h.base)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	testkit.Eventually(t, "socket subscribed", func() (bool, error) { return h.app.Feed().Clients() == 1, nil })

	// The group is removed at the provider.
	if !h.idp.SetGroups("temp") {
		t.Fatal("no such user at the provider")
	}
	clock.Advance(6 * time.Minute)
	resp, err := b.noRedirects().Do(func() *http.Request {
		req, _ := http.NewRequest(http.MethodGet, h.base+"/", nil)
		req.Header.Set("Accept", "text/html")
		return req
	}())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login") {
		t.Fatalf("request after the group was removed: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if ck := b.rec.set("sluice_session"); ck[len(ck)-1].MaxAge >= 0 {
		t.Errorf("the cookie of the ended session was not cleared: %+v", ck[len(ck)-1])
	}
	var n int
	_ = h.pool.QueryRow(context.Background(), `SELECT count(*) FROM console_session WHERE subject = 'user-temp'`).Scan(&n)
	if n != 0 {
		t.Fatalf("%d sessions left", n)
	}
	if h.countAudit(t, `action = 'auth.role_recheck' AND outcome = 'denied' AND error_code = 'no_mapped_role' AND actor_sub = 'user-temp'`) != 1 {
		t.Fatal("the ended session is not audited")
	}
	err = readUntilEnd(ws, 30*time.Second)
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.ClosePolicyViolation {
		t.Fatalf("websocket ended with %v, want close 1008", err)
	}
}

// Issue 8.10: a socket that is the session's only traffic re-checks the
// roles itself and closes when they are gone.
func TestRoleRemovedClosesAnIdleDashboardSocket(t *testing.T) {
	t.Parallel()
	clock := testkit.NewClock(time.Now())
	h := start(t, options{clock: clock.Now, recheck: 50 * time.Millisecond, configure: func(c *web.Config) { c.RoleRecheck = 5 * time.Minute }})
	h.idp.AddUser("temp", "temp", "oncall")
	b := newBrowser(t)
	h.login(t, b, "temp", "temp", "")
	ws, _, err := h.dial(t, b, h.base)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	h.idp.SetGroups("temp")
	clock.Advance(6 * time.Minute)
	err = readUntilEnd(ws, 30*time.Second)
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.ClosePolicyViolation {
		t.Fatalf("websocket ended with %v, want close 1008", err)
	}
	if h.countAudit(t, `action = 'auth.role_recheck' AND outcome = 'denied'`) != 1 {
		t.Fatal("the ended session is not audited")
	}
}

// A role reduced but not removed (auditor → viewer) closes a socket
// whose page the user may no longer see: the audit page's feed stops at the
// next re-check, while the session and its dashboard socket stay.
func TestRoleReducedClosesTheSocketOfAPageNoLongerAllowed(t *testing.T) {
	t.Parallel()
	clock := testkit.NewClock(time.Now())
	h := start(t, options{clock: clock.Now, recheck: 50 * time.Millisecond, configure: func(c *web.Config) { c.RoleRecheck = 5 * time.Minute }})
	h.idp.AddUser("demoted", "demoted", "audit")
	b := newBrowser(t)
	h.login(t, b, "demoted", "demoted", "")
	auditWS, err := h.dialPath(t, b, "/ws?page=audit")
	if err != nil {
		t.Fatal(err)
	}
	defer auditWS.Close()
	dash, _, err := h.dial(t, b, h.base)
	if err != nil {
		t.Fatal(err)
	}
	defer dash.Close()
	h.idp.SetGroups("demoted", "support")
	clock.Advance(6 * time.Minute)
	err = readUntilEnd(auditWS, 30*time.Second)
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.ClosePolicyViolation || ce.Text != "permission withdrawn" {
		t.Fatalf("the audit page's socket ended with %v, want close 1008 permission withdrawn", err)
	}
	// The dashboard's socket, which a viewer may keep, stays open through
	// later re-checks (every 50 ms here): reading it for a second ends in
	// the read's own timeout, never in a close frame.
	err = readUntilEnd(dash, time.Second)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("the dashboard's socket ended with %v; a viewer may keep it", err)
	}
	if resp, _ := b.get(t, h.base+"/audit", "text/html"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("the demoted user opened /audit: %d", resp.StatusCode)
	}
}

// Issue 8.10: signing out after the session expired is a normal sign-out:
// the stale cookie is cleared and the provider's end-session follows.
func TestSignOutAfterTheSessionExpired(t *testing.T) {
	t.Parallel()
	clock := testkit.NewClock(time.Now())
	h := start(t, options{clock: clock.Now})
	b := newBrowser(t)
	_, body := h.login(t, b, "oncall", "oncall", "")
	token := csrfField.FindStringSubmatch(body)[1]
	clock.Advance(31 * time.Minute) // past the idle timeout
	form := url.Values{"csrf_token": {token}}
	req, _ := http.NewRequest(http.MethodPost, h.base+"/logout", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := b.noRedirects().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, _ := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusSeeOther || loc == nil || !strings.HasPrefix(loc.String(), h.idp.Issuer()) ||
		loc.Query().Get("client_id") != "console" || loc.Query().Get("post_logout_redirect_uri") != h.base+"/signed-out" {
		t.Fatalf("sign-out of an expired session: %d to %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if ck := b.rec.set("sluice_session"); len(ck) != 2 || ck[1].MaxAge >= 0 || ck[1].Value != "" {
		t.Fatalf("the stale cookie was not cleared: %+v", ck)
	}
	if n := h.countAudit(t, `action = 'request.denied'`); n != 0 {
		t.Fatalf("%d denials for a sign-out", n)
	}
}

// The page the provider returns to after a sign-out says the session
// ended only when it has: a browser whose session is still live (a
// bookmark, the back button) is sent to the dashboard instead, and the
// cookie of a session that ended, replayed, shows the page.
func TestSignedOutPageOnlyAfterTheSessionEnded(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b, token := h.signedIn(t, "support")
	nr := b.noRedirects()
	signedOut := func() (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, h.base+"/signed-out", nil)
		req.Header.Set("Accept", "text/html")
		resp, err := nr.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(data)
	}
	if resp, body := signedOut(); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" || strings.Contains(body, "has ended") {
		t.Fatalf("/signed-out with a live session: %d to %q, want 303 to the dashboard", resp.StatusCode, resp.Header.Get("Location"))
	}
	stale := b.sessionCookie(h.base)
	resp := h.logout(t, b, token)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %d", resp.StatusCode)
	}
	if resp, body := signedOut(); resp.StatusCode != http.StatusOK || !strings.Contains(body, "Your console session has ended") {
		t.Fatalf("/signed-out after the sign-out: %d, want the page", resp.StatusCode)
	}
	u, _ := url.Parse(h.base)
	b.Jar.SetCookies(u, []*http.Cookie{{Name: "sluice_session", Value: stale, Path: "/"}})
	if resp, body := signedOut(); resp.StatusCode != http.StatusOK || !strings.Contains(body, "Your console session has ended") {
		t.Fatalf("/signed-out with the ended session's cookie: %d, want the page", resp.StatusCode)
	}
}

// Issue 8.10: the CSRF token counts only from the form body or the
// X-CSRF-Token header, never from the query string.
func TestCSRFTokenInTheQueryIsRefused(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b := newBrowser(t)
	_, body := h.login(t, b, "oncall", "oncall", "")
	token := csrfField.FindStringSubmatch(body)[1]
	req, _ := http.NewRequest(http.MethodPost, h.base+"/logout?csrf_token="+url.QueryEscape(token), nil)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := b.noRedirects().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || h.countAudit(t, `action = 'request.denied' AND error_code = 'csrf'`) != 1 {
		t.Fatalf("token in the query: %d, or not audited", resp.StatusCode)
	}
	if r, _ := b.get(t, h.base+"/", "text/html"); r.Request.URL.Path != "/" || r.StatusCode != http.StatusOK {
		t.Fatal("the session ended")
	}
}

// Issue 8.10: an https console sends HSTS; a plain-http loopback one does not.
func TestHSTSOnlyOnHTTPS(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	public := "https://console.example.test" // TLS ends at a proxy in front
	idp, err := devoidc.Start(context.Background(), devoidc.Config{Addr: "127.0.0.1:0", ClientID: "console", ClientSecret: "s",
		RedirectURIs: []string{public + "/auth/callback"}})
	if err != nil {
		t.Fatal(err)
	}
	defer idp.Close()
	rm, _ := auth.ParseRoleMap(devoidc.DemoRoleMap)
	ctx, cancel := context.WithCancel(context.Background())
	app, err := web.New(ctx, web.Config{PublicURL: public, OIDCIssuer: idp.Issuer(), OIDCClientID: "console", OIDCClientSecret: "s",
		RolesClaim: "groups", RoleMap: rm}, web.Deps{Pool: pool, Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx) }()
	defer func() { cancel(); <-done }()
	b := newBrowser(t)
	for _, p := range []string{"/healthz", "/", "/no/such"} {
		resp, err := b.noRedirects().Get("http://" + ln.Addr().String() + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("Strict-Transport-Security"); !strings.HasPrefix(got, "max-age=") {
			t.Errorf("https console %s: Strict-Transport-Security %q", p, got)
		}
	}
	h := start(t, options{})
	if resp, _ := b.get(t, h.base+"/healthz", ""); resp.Header.Get("Strict-Transport-Security") != "" {
		t.Error("HSTS on a plain-http loopback console")
	}
}

// Issue 8.10: a session may hold WSPerSession sockets; one more is refused
// with 429 before the upgrade (the open ones are kept), and closing one
// makes room.
func TestWebsocketsPerSessionAreLimited(t *testing.T) {
	t.Parallel()
	h := start(t, options{configure: func(c *web.Config) { c.WSPerSession = 3 }})
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	var open []*websocket.Conn
	for i := 0; i < 3; i++ {
		c, _, err := h.dial(t, b, h.base)
		if err != nil {
			t.Fatalf("socket %d: %v", i+1, err)
		}
		defer c.Close()
		open = append(open, c)
	}
	_, resp, err := h.dial(t, b, h.base)
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("fourth socket: %v %v, want 429", resp, err)
	}
	// Another session is not affected.
	other := newBrowser(t)
	h.login(t, other, "admin", "admin", "")
	oc, _, err := h.dial(t, other, h.base)
	if err != nil {
		t.Fatalf("another session's socket: %v", err)
	}
	oc.Close()
	if h.app.Feed().Clients() < 3 {
		t.Fatal("the refusal closed open sockets")
	}
	open[0].Close()
	testkit.Eventually(t, "room for a new socket after one closed", func() (bool, error) {
		c, _, err := h.dial(t, b, h.base)
		if err != nil {
			return false, err
		}
		c.Close()
		return true, nil
	})
}

// Issue 8.10: sign-ins are limited per client IP and pending logins are
// capped; over either the answer is 429 with a message and no row.
func TestLoginsAreRateLimited(t *testing.T) {
	t.Parallel()
	countLogins := func(h *harness) int {
		var n int
		if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM console_login`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	get := func(h *harness, path string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodGet, h.base+path, nil)
		req.Header.Set("Accept", "text/html")
		resp, err := newBrowser(t).noRedirects().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(body)
	}
	for _, c := range []struct {
		name          string
		rate, pending int
		allowed       int
	}{
		{"per IP", 5, 1000, 5},
		{"pending cap", 1000, 3, 3},
	} {
		h := start(t, options{configure: func(cfg *web.Config) { cfg.LoginRate, cfg.LoginPending = c.rate, c.pending }})
		for i := 0; i < c.allowed; i++ {
			if resp, _ := get(h, "/login"); resp.StatusCode != http.StatusFound {
				t.Fatalf("%s: login %d: %d", c.name, i+1, resp.StatusCode)
			}
		}
		resp, body := get(h, "/login")
		if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "Too many sign-ins") || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("%s: over the limit: %d %q", c.name, resp.StatusCode, body)
		}
		if n := countLogins(h); n != c.allowed {
			t.Fatalf("%s: %d pending logins, want %d", c.name, n, c.allowed)
		}
		if c.name == "per IP" { // the callback counts too: no audit row either
			if resp, _ := get(h, "/auth/callback?state=x&code=y"); resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("callback over the limit: %d", resp.StatusCode)
			}
			if n := h.countAudit(t, `action = 'auth.login'`); n != 0 {
				t.Fatalf("%d audit rows over the limit", n)
			}
		}
	}
}

// Issue 8.10: failed sign-ins are audited, not only logged.
func TestFailedSignInIsAudited(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b := newBrowser(t)
	resp, _ := b.get(t, h.base+"/auth/callback?state=forged&code=x", "text/html")
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("forged state: %d", resp.StatusCode)
	}
	rid := resp.Header.Get("X-Request-Id")
	if h.countAudit(t, `action = 'auth.login' AND outcome = 'denied' AND error_code = 'bad_state' AND request_id = $1 AND ip = '127.0.0.1'`, rid) != 1 {
		t.Fatal("the failed sign-in is not audited")
	}
}

// Issue 8.10: /ws opened in a tab is answered plainly, not as a refusal.
func TestWebsocketEndpointOpenedAsAPage(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	resp, body := b.get(t, h.base+"/ws", "text/html")
	if resp.StatusCode != http.StatusUpgradeRequired || !strings.Contains(body, "websocket endpoint") {
		t.Fatalf("GET /ws as a page: %d %q", resp.StatusCode, body)
	}
	if n := h.countAudit(t, `action = 'request.denied'`); n != 0 {
		t.Fatalf("%d denial rows for opening /ws", n)
	}
}

// Issue 8.10: with a provider that releases groups only for the groups
// scope (Dex, Keycloak, Authelia), the console asks for it (it is in the
// provider's scopes_supported) and the sign-in works; asked without it
// (an explicit OIDC_SCOPES), no role arrives.
func TestSignInThroughAProviderThatNeedsTheGroupsScope(t *testing.T) {
	t.Parallel()
	h := start(t, options{groupsScopeOnly: true})
	b := newBrowser(t)
	resp, err := b.noRedirects().Get(h.base + "/login")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, _ := url.Parse(resp.Header.Get("Location"))
	scopes := strings.Fields(loc.Query().Get("scope"))
	for _, want := range []string{"openid", "profile", "email", "groups", "offline_access"} {
		if !slices.Contains(scopes, want) {
			t.Errorf("scope %v lacks %s", scopes, want)
		}
	}
	resp2, body := h.login(t, b, "oncall", "oncall", "")
	if resp2.StatusCode != http.StatusOK || doc(t, body).Find(`[data-testid="role"]`).Text() != "operator" {
		t.Fatalf("sign-in with the groups scope: %d", resp2.StatusCode)
	}

	h2 := start(t, options{groupsScopeOnly: true, configure: func(c *web.Config) { c.OIDCScopes = []string{"openid", "profile"} }})
	resp3, _ := h2.login(t, newBrowser(t), "oncall", "oncall", "")
	if resp3.StatusCode != http.StatusForbidden || h2.countAudit(t, `error_code = 'no_mapped_role'`) != 1 {
		t.Fatalf("without the groups scope: %d (the mode releases groups anyway?)", resp3.StatusCode)
	}
}

// Issue 8.10: when the provider cannot be asked, the re-check keeps the
// session but refuses the request (503) rather than trust stale roles, and
// signing out still works.
func TestRoleRecheckWithTheProviderDown(t *testing.T) {
	t.Parallel()
	clock := testkit.NewClock(time.Now())
	h := start(t, options{clock: clock.Now, configure: func(c *web.Config) { c.RoleRecheck = 5 * time.Minute }})
	b := newBrowser(t)
	_, body := h.login(t, b, "oncall", "oncall", "")
	token := csrfField.FindStringSubmatch(body)[1]
	if err := h.idp.Close(); err != nil {
		t.Fatal(err)
	}
	clock.Advance(6 * time.Minute)
	resp, page := b.get(t, h.base+"/", "text/html")
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(page, "identity provider") {
		t.Fatalf("re-check with the provider down: %d", resp.StatusCode)
	}
	var n int
	_ = h.pool.QueryRow(context.Background(), `SELECT count(*) FROM console_session`).Scan(&n)
	if n != 1 {
		t.Fatalf("%d sessions: an outage must not end them", n)
	}
	req, _ := http.NewRequest(http.MethodPost, h.base+"/logout", strings.NewReader(url.Values{"csrf_token": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := b.noRedirects().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || h.countAudit(t, `action = 'auth.logout' AND outcome = 'ok'`) != 1 {
		t.Fatalf("sign-out with the provider down: %d", resp.StatusCode)
	}
}

// readUntilEnd reads ws until it ends (a close, an error) or for d, and
// returns how it ended: a *websocket.CloseError, or a timeout.
func readUntilEnd(ws *websocket.Conn, d time.Duration) error {
	_ = ws.SetReadDeadline(time.Now().Add(d))
	for {
		if _, _, err := ws.ReadMessage(); err != nil {
			return err
		}
	}
}
