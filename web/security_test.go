package web_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/outbox/outboxtest"
	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
	"github.com/sluice-dev/sluice/internal/testkit"
)

func doc(t *testing.T, body string) *goquery.Document {
	t.Helper()
	d, err := goquery.NewDocumentFromReader(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestEachDemoUserSignsInAndSeesTheirNavigation(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	cases := []string{"support", "oncall", "auditor", "admin"}
	roles := map[string]string{"support": "viewer", "oncall": "operator", "auditor": "auditor", "admin": "admin"}
	for _, user := range cases {
		b := newBrowser(t)
		resp, body := h.login(t, b, user, user, "")
		if resp.StatusCode != 200 || resp.Request.URL.String() != h.base+"/" {
			t.Fatalf("%s: landed on %s with %d", user, resp.Request.URL, resp.StatusCode)
		}
		d := doc(t, body)
		if got := d.Find(`[data-testid="role"]`).Text(); got != roles[user] {
			t.Errorf("%s: role %q, want %q", user, got, roles[user])
		}
		if got := d.Find(`[data-testid="user"]`).Text(); got != user {
			t.Errorf("%s: user %q", user, got)
		}
		// Only pages that exist and the role may see are in the
		// navigation: the dashboard, the outbox, the payments and the
		// inbox; the approvals and jobs for those who may act; the audit
		// trail for auditors and admins.
		var nav []string
		d.Find(`[data-testid="nav"] a`).Each(func(_ int, s *goquery.Selection) { nav = append(nav, s.AttrOr("data-testid", "")) })
		want := map[string]string{"oncall": "nav-dashboard,nav-outbox,nav-payments,nav-inbox,nav-relays,nav-approvals,nav-jobs",
			"auditor": "nav-dashboard,nav-outbox,nav-payments,nav-inbox,nav-relays,nav-audit",
			"admin":   "nav-dashboard,nav-outbox,nav-payments,nav-inbox,nav-relays,nav-approvals,nav-jobs,nav-audit"}[user]
		if want == "" {
			want = "nav-dashboard,nav-outbox,nav-payments,nav-inbox,nav-relays"
		}
		if strings.Join(nav, ",") != want {
			t.Errorf("%s: navigation %v, want %s", user, nav, want)
		}
		for _, id := range []string{"nav-dashboard", "backlog", "unknown", "conn"} {
			if d.Find(`[data-testid="`+id+`"]`).Length() != 1 {
				t.Errorf("%s: %s missing", user, id)
			}
		}
		ck := b.rec.set("sluice_session")
		if len(ck) != 1 || !ck[0].HttpOnly || ck[0].Path != "/" || ck[0].SameSite != http.SameSiteLaxMode || len(ck[0].Value) < 43 || ck[0].MaxAge != 0 || ck[0].Domain != "" {
			t.Fatalf("%s: session cookie %+v", user, ck)
		}
		// The login binding: short-lived, HttpOnly, and cleared by the callback.
		lk := b.rec.set("sluice_login")
		if len(lk) != 2 || !lk[0].HttpOnly || lk[0].Path != "/" || lk[0].SameSite != http.SameSiteLaxMode ||
			lk[0].MaxAge <= 0 || lk[0].MaxAge > 600 || len(lk[0].Value) < 43 || lk[1].MaxAge >= 0 {
			t.Fatalf("%s: login cookie %+v", user, lk)
		}
		// The provider states when the user authenticated (auth_time), so a
		// fresh login counts as recent for money-moving actions.
		var recent bool
		if err := h.pool.QueryRow(context.Background(), `SELECT auth_time > now() - interval '10 minutes' FROM console_session WHERE name = $1`, user).Scan(&recent); err != nil || !recent {
			t.Errorf("%s: session auth_time not recent (%v)", user, err)
		}
		if h.countAudit(t, `action = 'auth.login' AND outcome = 'ok' AND actor_name = $1 AND actor_iss = $2`, user, h.idp.Issuer()) != 1 {
			t.Errorf("%s: login not audited", user)
		}
	}
}

// Say only what is true: with a topic in the backlog, a dead letter and an
// unknown payment on the dashboard (so every kind of row renders), every
// href on the page, navigation included, and in its websocket fragments
// leads somewhere: none answers 404, for any role.
func TestEveryLinkOnTheDashboardLeadsSomewhere(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 100 * time.Millisecond})
	insertEvent(t, h, "ledger")
	outboxtest.Insert(t, h.pool, outboxtest.Seed{Topic: "orders", EventType: "order.placed.v1", AggregateID: "dead-1",
		Status: "dead", Attempts: 5, LastError: "refused"})
	account := paymentstest.Account(t, h.pool, paymentstest.AccountOpts{ID: 7, Balance: "1000"})
	paymentstest.Payment(t, h.pool, paymentstest.PaymentOpts{Account: account, Merchant: "m1", Invoice: "inv-1", Amount: "250.00"})
	for _, user := range []string{"support", "oncall", "auditor", "admin"} {
		b := newBrowser(t)
		h.login(t, b, user, user, "")
		var body string
		testkit.Eventually(t, "every kind of row on the dashboard", func() (bool, error) {
			_, body = b.get(t, h.base+"/", "text/html")
			d := doc(t, body)
			return d.Find(`[data-testid="topic-row"]`).Length() > 0 && d.Find(`[data-testid="recent-dead"] li`).Length() > 0 &&
				d.Find(`[data-testid="recent-unknown"] li`).Length() > 0, nil
		})
		conn, _, err := h.dial(t, b, h.base)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, frame, err := conn.ReadMessage()
		conn.Close()
		if err != nil {
			t.Fatalf("%s: no websocket frame: %v", user, err)
		}
		// The outbox list, an event's page and the inbox link onwards too.
		_, list := b.get(t, h.base+"/outbox", "text/html")
		_, deadList := b.get(t, h.base+"/outbox?status=dead", "text/html")
		event := doc(t, deadList).Find(`[data-testid="row-link"]`).AttrOr("href", "")
		if event == "" {
			t.Fatalf("%s: no event linked from the dead list", user)
		}
		_, detail := b.get(t, h.base+event, "text/html")
		_, inboxPage := b.get(t, h.base+"/inbox", "text/html")
		hrefs := map[string]bool{}
		for _, html := range []string{body, string(frame), list, deadList, detail, inboxPage} {
			doc(t, html).Find("[href]").Each(func(_ int, s *goquery.Selection) { hrefs[s.AttrOr("href", "")] = true })
		}
		for _, want := range []string{"/outbox?status=dead", "/outbox?status=held_dead", "/outbox", "/inbox", event} {
			if !hrefs[want] {
				t.Errorf("%s: no link to %s", user, want)
			}
		}
		doc(t, body).Find(`[data-testid="nav"] a`).Each(func(_ int, s *goquery.Selection) {
			if !hrefs[s.AttrOr("href", "")] {
				t.Errorf("%s: nav link %q not collected", user, s.AttrOr("href", ""))
			}
		})
		if len(hrefs) < 4 { // the stylesheet, the icon, the skip link, the brand and the dashboard at least
			t.Fatalf("%s: only %d hrefs found: %v", user, len(hrefs), hrefs)
		}
		for href := range hrefs {
			u, err := url.Parse(href)
			if err != nil {
				t.Errorf("%s: href %q: %v", user, href, err)
				continue
			}
			target := h.base + u.Path
			if u.Path == "" { // a fragment of this page
				target = h.base + "/"
			}
			if u.RawQuery != "" {
				target += "?" + u.RawQuery
			}
			resp, _ := b.get(t, target, "text/html")
			if resp.StatusCode == http.StatusNotFound || resp.StatusCode >= 500 {
				t.Errorf("%s: link %q answers %d", user, href, resp.StatusCode)
			}
		}
	}
}

// SECURITY.md case 2 through the real flow.
func TestUserWithoutMappedGroupGetsNoCookie(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	h.idp.AddUser("intern", "intern", "marketing")
	b := newBrowser(t)
	resp, body := h.login(t, b, "intern", "intern", "")
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("want 403, got %d", resp.StatusCode)
	}
	if strings.Contains(body, "no_mapped_role") || strings.Contains(body, "auth:") {
		t.Fatal("internal error text in the response")
	}
	for _, c := range b.rec.set("sluice_session") {
		if c.Value != "" {
			t.Fatalf("a session cookie was set: %+v", c)
		}
	}
	if h.countAudit(t, `action = 'auth.login' AND outcome = 'denied' AND error_code = 'no_mapped_role' AND actor_sub = 'user-intern'`) != 1 {
		t.Fatal("denial not audited")
	}
	var n int
	_ = h.pool.QueryRow(context.Background(), `SELECT count(*) FROM console_session`).Scan(&n)
	if n != 0 {
		t.Fatalf("%d sessions", n)
	}
}

// SECURITY.md case 7 through the real flow.
func TestNextRedirectStaysOnTheConsole(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	for next, want := range map[string]string{
		"//evil.example/x": "/",
		`/\evil.example`:   "/",
		"https:evil":       "/",
		"/?from=login":     "/?from=login",
	} {
		b := newBrowser(t)
		resp, _ := h.login(t, b, "support", "support", next)
		if got := resp.Request.URL.String(); got != h.base+want {
			t.Errorf("next=%q landed on %s, want %s", next, got, h.base+want)
		}
	}
}

func TestCallbackWithoutStateIsRefused(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b := newBrowser(t)
	for _, q := range []string{"", "?code=x", "?state=forged&code=x"} {
		resp, body := b.get(t, h.base+"/auth/callback"+q, "text/html")
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, `data-testid="request-id"`) {
			t.Errorf("callback%s: %d", q, resp.StatusCode)
		}
	}
	if len(b.rec.set("sluice_session")) != 0 {
		t.Fatal("session cookie set")
	}
}

func TestAnonymousGetsNothing(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b := newBrowser(t).noRedirects()
	get := func(path, accept string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, h.base+path, nil)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := b.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	if r := get("/?x=1", "text/html,application/xhtml+xml"); r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/login?next="+url.QueryEscape("/?x=1") {
		t.Errorf("page: %d %s", r.StatusCode, r.Header.Get("Location"))
	}
	if r := get("/", "application/json"); r.StatusCode != http.StatusUnauthorized {
		t.Errorf("non-HTML: %d", r.StatusCode)
	}
	if r := get("/ws", ""); r.StatusCode != http.StatusUnauthorized {
		t.Errorf("/ws: %d", r.StatusCode)
	}
	for _, p := range []string{"/healthz", "/readyz", "/static/htmx.min.js", "/static/favicon.svg", "/metrics"} {
		if r := get(p, ""); r.StatusCode != http.StatusOK {
			t.Errorf("%s: %d", p, r.StatusCode)
		}
	}
	resp, err := b.PostForm(h.base+"/logout", url.Values{"csrf_token": {"x"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// Without a session the refusal goes to the refusal log, not the chain.
	if resp.StatusCode != http.StatusForbidden || h.countRefusals(t, `reason = 'no_session' AND route = 'POST /logout'`) != 1 ||
		h.countAudit(t, `true`) != 0 {
		t.Fatalf("anonymous POST: %d, or not in the refusal log, or in the chain", resp.StatusCode)
	}
}

var csrfField = regexp.MustCompile(`name="csrf_token" value="([^"]+)"`)

// SECURITY.md case 4: cross-site POST, POST without token, htmx POST without
// token → 403, nothing changed (the session survives), denial audited.
func TestForgedPostsAreRefusedAndAudited(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b := newBrowser(t)
	_, body := h.login(t, b, "oncall", "oncall", "")
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		t.Fatal("no CSRF token on the page")
	}
	token := m[1]
	if !strings.Contains(body, `hx-headers="{&#34;X-CSRF-Token&#34;:&#34;`+token) {
		t.Fatal("htmx does not send the CSRF token header")
	}
	nr := b.noRedirects()
	post := func(form url.Values, hdr map[string]string) int {
		req, _ := http.NewRequest(http.MethodPost, h.base+"/logout", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := nr.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	alive := func() bool {
		req, _ := http.NewRequest(http.MethodGet, h.base+"/", nil)
		req.Header.Set("Accept", "text/html")
		resp, err := nr.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	cases := []struct {
		name   string
		form   url.Values
		hdr    map[string]string
		reason string
	}{
		{"cross-site form with a valid token", url.Values{"csrf_token": {token}}, map[string]string{"Sec-Fetch-Site": "cross-site"}, "cross_origin"},
		{"foreign Origin", url.Values{"csrf_token": {token}}, map[string]string{"Origin": "https://evil.example"}, "cross_origin"},
		{"form without token", url.Values{}, nil, "csrf"},
		{"htmx without token", url.Values{}, map[string]string{"HX-Request": "true", "Sec-Fetch-Site": "same-origin"}, "csrf"},
		{"wrong token", url.Values{"csrf_token": {token + "x"}}, nil, "csrf"},
		{"token of another header", url.Values{}, map[string]string{"X-CSRF-Token": "AAAA"}, "csrf"},
	}
	for _, c := range cases {
		before := h.countAudit(t, `action = 'request.denied' AND error_code = $1`, c.reason)
		if code := post(c.form, c.hdr); code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", c.name, code)
		}
		if !alive() {
			t.Fatalf("%s: the forged POST changed something (session ended)", c.name)
		}
		if h.countAudit(t, `action = 'request.denied' AND error_code = $1`, c.reason) != before+1 {
			t.Errorf("%s: denial not audited", c.name)
		}
	}
	// The real thing, with the header htmx sends: logout works and goes to
	// the provider's end_session_endpoint.
	resp := h.logout(t, b, token)
	loc, _ := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusSeeOther || loc == nil || !strings.HasPrefix(loc.String(), h.idp.Issuer()) ||
		loc.Query().Get("id_token_hint") == "" || loc.Query().Get("post_logout_redirect_uri") != h.base+"/signed-out" {
		t.Fatalf("logout: %d to %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if h.countAudit(t, `action = 'auth.logout' AND outcome = 'ok'`) != 1 {
		t.Fatal("logout not audited")
	}
	if alive() {
		t.Fatal("session alive after logout")
	}
	if ck := b.rec.set("sluice_session"); len(ck) != 2 || ck[1].MaxAge >= 0 || ck[1].Value != "" {
		t.Fatalf("logout did not delete the session cookie: %+v", ck)
	}
}

func TestSecurityHeadersAndNonce(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b := newBrowser(t)
	resp, body := h.login(t, b, "support", "support", "")
	csp := resp.Header.Get("Content-Security-Policy")
	m := regexp.MustCompile(`script-src 'nonce-([^']+)'`).FindStringSubmatch(csp)
	if m == nil {
		t.Fatalf("CSP %q", csp)
	}
	for _, want := range []string{"default-src 'self'", "object-src 'none'", "base-uri 'none'", "frame-ancestors 'none'", "connect-src 'self'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP lacks %q", want)
		}
	}
	d := doc(t, body)
	d.Find("script").Each(func(_ int, s *goquery.Selection) {
		if n, _ := s.Attr("nonce"); n != m[1] {
			t.Errorf("script %v without the request's nonce", s.AttrOr("src", "inline"))
		}
	})
	cfg, _ := d.Find(`meta[name="htmx-config"]`).Attr("content")
	for _, want := range []string{`"allowEval":false`, `"allowScriptTags":false`, `"selfRequestsOnly":true`} {
		if !strings.Contains(cfg, want) {
			t.Errorf("htmx config lacks %s: %s", want, cfg)
		}
	}
	if resp.Header.Get("X-Content-Type-Options") != "nosniff" || resp.Header.Get("Referrer-Policy") != "same-origin" || resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("headers %v", resp.Header)
	}
	resp2, _ := b.get(t, h.base+"/", "text/html")
	if strings.Contains(resp2.Header.Get("Content-Security-Policy"), m[1]) {
		t.Error("nonce reused across requests")
	}
	// One error path: generic page, request id, no internals.
	resp3, body3 := b.get(t, h.base+"/no/such/page", "text/html")
	if resp3.StatusCode != http.StatusNotFound || !strings.Contains(body3, resp3.Header.Get("X-Request-Id")) {
		t.Errorf("404 page: %d", resp3.StatusCode)
	}
	// Error responses carry the same headers as pages.
	req, _ := http.NewRequest(http.MethodPut, h.base+"/", nil)
	resp4, err := b.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp4.Body.Close()
	// OPTIONS is refused like any other method a route does not take, to
	// everyone: echo answered it itself, 204 and the route's methods.
	for _, path := range []string{"/", "/outbox/" + uuid.NewString() + "/discard", "/payments/settlements"} {
		req, _ := http.NewRequest(http.MethodOptions, h.base+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "" {
			t.Errorf("anonymous OPTIONS %s: %d, Allow %q; want 405 and no Allow", path, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
	for _, r := range []*http.Response{resp3, resp4} {
		if r.StatusCode < 400 || !strings.Contains(r.Header.Get("Content-Security-Policy"), "default-src 'self'") ||
			r.Header.Get("X-Content-Type-Options") != "nosniff" || r.Header.Get("Cache-Control") != "no-store" {
			t.Errorf("%d response without the security headers: %v", r.StatusCode, r.Header)
		}
	}
}

// SECURITY.md case 3 over HTTP: after a new login the old cookie value is
// worthless, and a value planted before login never becomes a session.
func TestOldSessionCookieIsUselessAfterLogin(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b := newBrowser(t)
	u, _ := url.Parse(h.base)
	b.Jar.SetCookies(u, []*http.Cookie{{Name: "sluice_session", Value: "planted-by-attacker", Path: "/"}})
	h.login(t, b, "support", "support", "")
	first := b.sessionCookie(h.base)
	if first == "" || first == "planted-by-attacker" {
		t.Fatalf("login kept the planted id: %q", first)
	}
	h.login(t, b, "support", "support", "")
	second := b.sessionCookie(h.base)
	if second == first {
		t.Fatal("second login reused the session id")
	}
	for _, old := range []string{"planted-by-attacker", first} {
		req, _ := http.NewRequest(http.MethodGet, h.base+"/", nil)
		req.Header.Set("Accept", "text/html")
		req.AddCookie(&http.Cookie{Name: "sluice_session", Value: old})
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login") {
			t.Fatalf("old id %q still opens the dashboard: %d", old[:8], resp.StatusCode)
		}
	}
	var n int
	_ = h.pool.QueryRow(context.Background(), `SELECT count(*) FROM console_session`).Scan(&n)
	if n != 1 {
		t.Fatalf("%d sessions after two logins in one browser, want 1", n)
	}
}
