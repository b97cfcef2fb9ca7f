package auth_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc/oidctest"
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/auth"
)

// The guard enforces each route's declared access: permission, CSRF on
// unsafe methods, and a recorded 403 for every refusal (audited for a
// signed-in user, in the refusal log without a session).
func TestGuardEnforcesPermissionAndCSRF(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil) // logins map to operator
	l, err := f.login(t, "/", "")
	if err != nil {
		t.Fatal(err)
	}
	cookies, _ := auth.NewCookieSpec("http://127.0.0.1:8080")
	g := &auth.Guard{Sessions: f.sessions, Pool: f.pool, Cookies: cookies}
	e := echo.New()
	ok := func(c echo.Context) error { return c.String(http.StatusOK, "done") }
	e.GET("/audit", ok, g.Require(auth.Access{Perm: auth.PermAudit, Page: true}))
	e.GET("/outbox", ok, g.Require(auth.Access{Perm: auth.PermView, Page: true}))
	e.POST("/outbox/:id/retry", ok, g.Require(auth.Access{Perm: auth.PermOutboxAct}))
	e.POST("/pii/reveal", ok, g.Require(auth.Access{Perm: auth.PermRevealPII}))
	do := func(method, path, token string, withCookie bool) int {
		var body *strings.Reader
		if token != "" {
			body = strings.NewReader(url.Values{"csrf_token": {token}}.Encode())
		} else {
			body = strings.NewReader("")
		}
		req := httptest.NewRequest(method, path, body)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Accept", "text/html")
		if withCookie {
			req.AddCookie(cookies.SessionCookie(l.Token))
		}
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		return rec.Code
	}
	csrf := l.Session.CSRFToken()
	cases := []struct {
		method, path, token string
		cookie              bool
		want                int
	}{
		{"GET", "/outbox", "", true, 200},
		{"GET", "/audit", "", true, 403},  // operator may not see the audit trail
		{"GET", "/audit", "", false, 303}, // anonymous page → login
		{"POST", "/outbox/1/retry", csrf, true, 200},
		{"POST", "/outbox/1/retry", "", true, 403},         // no token
		{"POST", "/outbox/1/retry", csrf + "x", true, 403}, // bad token
		{"POST", "/outbox/1/retry", csrf, false, 403},      // no session
		{"POST", "/pii/reveal", csrf, true, 200},
	}
	denied, refused := 0, 0
	for _, c := range cases {
		if got := do(c.method, c.path, c.token, c.cookie); got != c.want {
			t.Errorf("%s %s token=%v cookie=%v: %d, want %d", c.method, c.path, c.token != "", c.cookie, got, c.want)
		}
		switch {
		case c.want == 403 && c.cookie:
			denied++
		case c.want == 403:
			refused++ // no session: the refusal log, not the chain
		}
	}
	var n, r int
	if err := f.pool.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM audit_event WHERE action = 'request.denied' AND outcome = 'denied'),
		       (SELECT count(*) FROM console_refusal WHERE reason = 'no_session' AND route = 'POST /outbox/:id/retry')`).Scan(&n, &r); err != nil {
		t.Fatal(err)
	}
	if n != denied || r != refused {
		t.Fatalf("%d denials audited, want %d; %d refusals logged, want %d", n, denied, r, refused)
	}
	var route, code string
	_ = f.pool.QueryRow(context.Background(), `SELECT target_id, error_code FROM audit_event WHERE action = 'request.denied' ORDER BY seq LIMIT 1`).Scan(&route, &code)
	if route != "GET /audit" || code != "permission" {
		t.Fatalf("first denial recorded as %q/%q", route, code)
	}
}

// Money-moving actions need a recent login: an older one must sign in again.
func TestGuardRequiresRecentLogin(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	l, err := f.login(t, "/", "")
	if err != nil {
		t.Fatal(err)
	}
	cookies, _ := auth.NewCookieSpec("http://127.0.0.1:8080")
	now := time.Now()
	g := &auth.Guard{Sessions: f.sessions, Pool: f.pool, Cookies: cookies, Now: func() time.Time { return now }}
	e := echo.New()
	var got error
	e.HTTPErrorHandler = func(err error, c echo.Context) { got = err; _ = c.NoContent(499) }
	e.POST("/payments/:id/resolve", func(c echo.Context) error { return c.NoContent(200) },
		g.Require(auth.Access{Perm: auth.PermPaymentsAct, MaxAuthAge: 10 * time.Minute}))
	post := func() int {
		got = nil
		req := httptest.NewRequest("POST", "/payments/x/resolve", nil)
		req.Header.Set("X-CSRF-Token", l.Session.CSRFToken())
		req.AddCookie(cookies.SessionCookie(l.Token))
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		return rec.Code
	}
	if code := post(); code != 200 {
		t.Fatalf("fresh login refused: %d %v", code, got)
	}
	now = now.Add(11 * time.Minute)
	if code := post(); code != 499 || !errors.Is(got, auth.ErrReauthRequired) {
		t.Fatalf("stale login: %d %v", code, got)
	}
	authURL, _, err := f.rp.Begin(context.Background(), "/", true)
	if err != nil || !strings.Contains(authURL, "prompt=login") || !strings.Contains(authURL, "max_age=0") {
		t.Fatalf("re-authentication URL %s %v", authURL, err)
	}
}

// Without auth_time the authentication time is unknown: a token minted by a
// silent single sign-on (fresh iat, old authentication) is not a recent
// login, so a money-moving action asks for a re-authentication.
func TestTokenWithoutAuthTimeIsNotARecentLogin(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.idp.mint = func(nonce string) string {
		b, _ := json.Marshal(map[string]any{
			"iss": f.idp.URL, "sub": "staff-1", "aud": "console", "nonce": nonce, "groups": []string{"oncall"},
			"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix(),
		})
		return oidctest.SignIDToken(idpKey, "k1", "RS256", string(b))
	}
	l, err := f.login(t, "/", "")
	if err != nil {
		t.Fatal(err)
	}
	cookies, _ := auth.NewCookieSpec("http://127.0.0.1:8080")
	g := &auth.Guard{Sessions: f.sessions, Pool: f.pool, Cookies: cookies}
	e := echo.New()
	var got error
	e.HTTPErrorHandler = func(err error, c echo.Context) { got = err; _ = c.NoContent(499) }
	e.POST("/payments/:id/resolve", func(c echo.Context) error { return c.NoContent(200) },
		g.Require(auth.Access{Perm: auth.PermPaymentsAct, MaxAuthAge: 10 * time.Minute}))
	req := httptest.NewRequest("POST", "/payments/x/resolve", nil)
	req.Header.Set("X-CSRF-Token", l.Session.CSRFToken())
	req.AddCookie(cookies.SessionCookie(l.Token))
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, req)
	if !errors.Is(got, auth.ErrReauthRequired) {
		t.Fatalf("a login of unknown age passed a recent-login check: %d %v", rec.Code, got)
	}
}
