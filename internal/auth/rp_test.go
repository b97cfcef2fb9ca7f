package auth_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc/oidctest"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

var (
	keysOnce         sync.Once
	idpKey, otherKey *rsa.PrivateKey
)

func keys(t *testing.T) {
	keysOnce.Do(func() {
		var err error
		if idpKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if otherKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
	})
}

// testIDP is go-oidc's oidctest (discovery and keys) plus a token endpoint
// that enforces PKCE and one-time codes and answers with whatever ID token
// the test mints for the login's nonce.
type testIDP struct {
	*httptest.Server
	mu    sync.Mutex
	codes map[string]string // code → the challenge of the login it belongs to
	used  map[string]bool
	mint  func(nonce string) string
	nonce map[string]string // code → nonce
	// refresh, when set, is the refresh token the code grant hands out;
	// the refresh grant then answers only that token, with a new ID token
	// and next as the rotated refresh token.
	refresh, next string
	refreshed     int // refresh grants answered
}

func newTestIDP(t *testing.T) *testIDP {
	keys(t)
	idp := &testIDP{codes: map[string]string{}, used: map[string]bool{}, nonce: map[string]string{}}
	ot := &oidctest.Server{PublicKeys: []oidctest.PublicKey{{PublicKey: idpKey.Public(), KeyID: "k1", Algorithm: "RS256"}}}
	mux := http.NewServeMux()
	mux.Handle("/", ot)
	mux.HandleFunc("POST /token", func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		if r.PostForm.Get("grant_type") == "refresh_token" {
			idp.mu.Lock()
			ok := idp.refresh != "" && r.PostForm.Get("refresh_token") == idp.refresh
			if ok {
				idp.refresh, idp.next = idp.next, ""
				idp.refreshed++
			}
			rotated := idp.refresh
			idp.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			if !ok {
				w.WriteHeader(http.StatusBadRequest)
				fmt.Fprint(w, `{"error":"invalid_grant"}`)
				return
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"access_token": "at", "token_type": "Bearer", "expires_in": 60,
				"id_token": idp.mint(""), "refresh_token": rotated})
			return
		}
		code, verifier := r.PostForm.Get("code"), r.PostForm.Get("code_verifier")
		idp.mu.Lock()
		challenge, ok := idp.codes[code]
		replay := idp.used[code]
		idp.used[code] = true
		nonce := idp.nonce[code]
		idp.mu.Unlock()
		sum := sha256.Sum256([]byte(verifier))
		if !ok || replay || base64.RawURLEncoding.EncodeToString(sum[:]) != challenge {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":"invalid_grant"}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		answer := map[string]any{"access_token": "at", "token_type": "Bearer", "expires_in": 60, "id_token": idp.mint(nonce)}
		idp.mu.Lock()
		if idp.refresh != "" {
			answer["refresh_token"] = idp.refresh
		}
		idp.mu.Unlock()
		_ = json.NewEncoder(w).Encode(answer)
	})
	idp.Server = httptest.NewServer(mux)
	ot.SetIssuer(idp.URL)
	t.Cleanup(idp.Close)
	return idp
}

func (idp *testIDP) grants() int {
	idp.mu.Lock()
	defer idp.mu.Unlock()
	return idp.refreshed
}

// authorize plays the provider's authorize endpoint: it records the PKCE
// challenge and nonce of the login and returns a code.
func (idp *testIDP) authorize(t *testing.T, authURL string) (state, code string) {
	t.Helper()
	u, err := url.Parse(authURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "" || q.Get("nonce") == "" || len(q.Get("state")) < 22 {
		t.Fatalf("authorization URL lacks PKCE S256, nonce or a 128-bit state: %s", authURL)
	}
	code = fmt.Sprintf("code-%d", time.Now().UnixNano())
	idp.mu.Lock()
	idp.codes[code], idp.nonce[code] = q.Get("code_challenge"), q.Get("nonce")
	idp.mu.Unlock()
	return q.Get("state"), code
}

func claims(iss, aud, nonce string, exp time.Time, groups ...string) string {
	return claimsWith(iss, aud, nonce, exp, nil, groups...)
}

// claimsWith is claims with some claims replaced or added (aud may be a
// list, azp, iat).
func claimsWith(iss string, aud any, nonce string, exp time.Time, extra map[string]any, groups ...string) string {
	m := map[string]any{
		"iss": iss, "sub": "staff-1", "aud": aud, "nonce": nonce, "preferred_username": "ayse",
		"iat": exp.Add(-time.Hour).Unix(), "auth_time": exp.Add(-time.Hour).Unix(), "exp": exp.Unix(), "groups": groups,
	}
	for k, v := range extra {
		m[k] = v
	}
	b, _ := json.Marshal(m)
	return string(b)
}

type fixture struct {
	pool     *pgxpool.Pool
	idp      *testIDP
	rp       *auth.RP
	sessions *auth.Sessions
	now      time.Time
}

func newFixture(t *testing.T, clock func() time.Time) *fixture {
	t.Helper()
	pool := dbtest.New(t)
	idp := newTestIDP(t)
	f := &fixture{pool: pool, idp: idp, now: time.Now()}
	if clock == nil {
		clock = time.Now
	}
	f.sessions = auth.NewSessions(pool, 12*time.Hour, 30*time.Minute, nil)
	rm, err := auth.ParseRoleMap("support:viewer,oncall:operator,audit:auditor,sre:admin")
	if err != nil {
		t.Fatal(err)
	}
	f.rp, err = auth.NewRP(context.Background(), auth.RPConfig{
		Issuer: idp.URL, ClientID: "console", ClientSecret: "s", RedirectURL: "http://127.0.0.1:1/auth/callback",
		RoleMap: rm, Now: clock,
	}, pool, f.sessions)
	if err != nil {
		t.Fatal(err)
	}
	idp.mint = func(nonce string) string {
		return oidctest.SignIDToken(idpKey, "k1", "RS256", claims(idp.URL, "console", nonce, time.Now().Add(time.Hour), "oncall"))
	}
	return f
}

func (f *fixture) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (f *fixture) login(t *testing.T, next, old string) (*auth.Login, error) {
	t.Helper()
	authURL, binding, err := f.rp.Begin(context.Background(), next, false)
	if err != nil {
		t.Fatal(err)
	}
	state, code := f.idp.authorize(t, authURL)
	return f.rp.Finish(context.Background(), auth.Callback{State: state, Code: code, Binding: binding, OldSession: old})
}

func TestLoginCreatesSessionWithMappedRoles(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	l, err := f.login(t, "/outbox?status=dead", "")
	if err != nil {
		t.Fatal(err)
	}
	if l.Next != "/outbox?status=dead" || len(l.Session.Roles) != 1 || l.Session.Roles[0] != auth.RoleOperator || l.Session.Subject != "staff-1" || l.Session.Issuer != f.idp.URL {
		t.Fatalf("unexpected login %+v %+v", l, l.Session)
	}
	sess, err := f.sessions.Touch(context.Background(), l.Token)
	if err != nil || sess.Name != "ayse" || !sess.Can(auth.PermOutboxAct) || sess.Can(auth.PermAudit) {
		t.Fatalf("session lookup: %+v %v", sess, err)
	}
	var stored []byte
	_ = f.pool.QueryRow(context.Background(), `SELECT id_hash FROM console_session`).Scan(&stored)
	if string(stored) == l.Token || len(stored) != 32 {
		t.Fatal("the session id must be stored as its sha256, never in clear")
	}
}

// SECURITY.md case 1: every bad callback or token → error, no session.
func TestBadCallbacksCreateNoSession(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		want error
		code string // the failed attempt's audit error_code
		run  func(t *testing.T, f *fixture) error
	}{
		{"missing state", auth.ErrBadState, "bad_state", func(t *testing.T, f *fixture) error {
			authURL, binding, _ := f.rp.Begin(context.Background(), "/", false)
			_, code := f.idp.authorize(t, authURL)
			_, err := f.rp.Finish(context.Background(), auth.Callback{Code: code, Binding: binding})
			return err
		}},
		{"altered state", auth.ErrBadState, "bad_state", func(t *testing.T, f *fixture) error {
			authURL, binding, _ := f.rp.Begin(context.Background(), "/", false)
			state, code := f.idp.authorize(t, authURL)
			_, err := f.rp.Finish(context.Background(), auth.Callback{State: state + "x", Code: code, Binding: binding})
			return err
		}},
		{"state from another browser", auth.ErrBadState, "bad_state", func(t *testing.T, f *fixture) error {
			authURL, _, _ := f.rp.Begin(context.Background(), "/", false)
			_, otherBinding, _ := f.rp.Begin(context.Background(), "/", false)
			state, code := f.idp.authorize(t, authURL)
			_, err := f.rp.Finish(context.Background(), auth.Callback{State: state, Code: code, Binding: otherBinding})
			return err
		}},
		{"replayed state", auth.ErrBadState, "bad_state", func(t *testing.T, f *fixture) error {
			authURL, binding, _ := f.rp.Begin(context.Background(), "/", false)
			state, code := f.idp.authorize(t, authURL)
			f.idp.mint = func(string) string { return "garbage" } // first use fails after consuming the state
			if _, err := f.rp.Finish(context.Background(), auth.Callback{State: state, Code: code, Binding: binding}); !errors.Is(err, auth.ErrLoginFailed) {
				t.Fatalf("first use: %v", err)
			}
			_, err := f.rp.Finish(context.Background(), auth.Callback{State: state, Code: code, Binding: binding})
			return err
		}},
		{"replayed code", auth.ErrLoginFailed, "code_exchange", func(t *testing.T, f *fixture) error {
			authURL, binding, _ := f.rp.Begin(context.Background(), "/", false)
			state, code := f.idp.authorize(t, authURL)
			if _, err := f.rp.Finish(context.Background(), auth.Callback{State: state, Code: code, Binding: binding}); err != nil {
				t.Fatal(err)
			}
			if err := f.pool.QueryRow(context.Background(), `DELETE FROM console_session RETURNING 1`).Scan(new(int)); err != nil {
				t.Fatal(err)
			}
			authURL2, binding2, _ := f.rp.Begin(context.Background(), "/", false)
			state2, _ := f.idp.authorize(t, authURL2)
			_, err := f.rp.Finish(context.Background(), auth.Callback{State: state2, Code: code, Binding: binding2})
			return err
		}},
		{"wrong nonce", auth.ErrLoginFailed, "nonce_mismatch", func(t *testing.T, f *fixture) error {
			f.idp.mint = func(string) string {
				return oidctest.SignIDToken(idpKey, "k1", "RS256", claims(f.idp.URL, "console", "other-nonce", time.Now().Add(time.Hour), "oncall"))
			}
			_, err := f.login(t, "/", "")
			return err
		}},
		{"other audience", auth.ErrLoginFailed, "token_invalid", func(t *testing.T, f *fixture) error {
			f.idp.mint = func(n string) string {
				return oidctest.SignIDToken(idpKey, "k1", "RS256", claims(f.idp.URL, "someone-else", n, time.Now().Add(time.Hour), "oncall"))
			}
			_, err := f.login(t, "/", "")
			return err
		}},
		{"other issuer", auth.ErrLoginFailed, "token_invalid", func(t *testing.T, f *fixture) error {
			f.idp.mint = func(n string) string {
				return oidctest.SignIDToken(idpKey, "k1", "RS256", claims("https://evil.example", "console", n, time.Now().Add(time.Hour), "oncall"))
			}
			_, err := f.login(t, "/", "")
			return err
		}},
		{"alg none", auth.ErrLoginFailed, "token_invalid", func(t *testing.T, f *fixture) error {
			f.idp.mint = func(n string) string {
				enc := base64.RawURLEncoding.EncodeToString
				return enc([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + enc([]byte(claims(f.idp.URL, "console", n, time.Now().Add(time.Hour), "oncall"))) + "."
			}
			_, err := f.login(t, "/", "")
			return err
		}},
		{"signed by another key", auth.ErrLoginFailed, "token_invalid", func(t *testing.T, f *fixture) error {
			f.idp.mint = func(n string) string {
				return oidctest.SignIDToken(otherKey, "k1", "RS256", claims(f.idp.URL, "console", n, time.Now().Add(time.Hour), "oncall"))
			}
			_, err := f.login(t, "/", "")
			return err
		}},
		{"several audiences and no azp", auth.ErrLoginFailed, "azp_mismatch", func(t *testing.T, f *fixture) error {
			f.idp.mint = func(n string) string {
				return oidctest.SignIDToken(idpKey, "k1", "RS256", claimsWith(f.idp.URL, []string{"console", "other-app"}, n, time.Now().Add(time.Hour), nil, "oncall"))
			}
			_, err := f.login(t, "/", "")
			return err
		}},
		{"azp of another client", auth.ErrLoginFailed, "azp_mismatch", func(t *testing.T, f *fixture) error {
			f.idp.mint = func(n string) string {
				return oidctest.SignIDToken(idpKey, "k1", "RS256", claimsWith(f.idp.URL, []string{"console", "other-app"}, n, time.Now().Add(time.Hour),
					map[string]any{"azp": "other-app"}, "oncall"))
			}
			_, err := f.login(t, "/", "")
			return err
		}},
		{"issued in the future", auth.ErrLoginFailed, "issued_in_future", func(t *testing.T, f *fixture) error {
			f.idp.mint = func(n string) string {
				return oidctest.SignIDToken(idpKey, "k1", "RS256", claimsWith(f.idp.URL, "console", n, time.Now().Add(time.Hour),
					map[string]any{"iat": time.Now().Add(5 * time.Minute).Unix()}, "oncall"))
			}
			_, err := f.login(t, "/", "")
			return err
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, nil)
			err := c.run(t, f)
			if !errors.Is(err, c.want) {
				t.Fatalf("want %v, got %v", c.want, err)
			}
			if n := f.count(t, "console_session"); n != 0 {
				t.Fatalf("%d session(s) exist after a failed login", n)
			}
			var n int
			if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_event
				WHERE action = 'auth.login' AND outcome = 'denied' AND error_code = $1`, c.code).Scan(&n); err != nil || n == 0 {
				t.Fatalf("the failed sign-in is not audited as %s (%v)", c.code, err)
			}
		})
	}
}

// Tokens for several audiences are accepted when azp names this client,
// and a provider clock a little ahead (under a minute) is tolerated.
func TestTokenWithAZPOrSmallSkewIsAccepted(t *testing.T) {
	t.Parallel()
	for name, mint := range map[string]func(iss, nonce string) string{
		"several audiences, azp ours": func(iss, n string) string {
			return claimsWith(iss, []string{"console", "other-app"}, n, time.Now().Add(time.Hour), map[string]any{"azp": "console"}, "oncall")
		},
		"iat 30s ahead": func(iss, n string) string {
			return claimsWith(iss, "console", n, time.Now().Add(time.Hour), map[string]any{"iat": time.Now().Add(30 * time.Second).Unix()}, "oncall")
		},
	} {
		f := newFixture(t, nil)
		f.idp.mint = func(n string) string { return oidctest.SignIDToken(idpKey, "k1", "RS256", mint(f.idp.URL, n)) }
		if _, err := f.login(t, "/", ""); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// The verifier's clock is injected: an expired token is refused without sleeping.
func TestExpiredTokenIsRefused(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	now := time.Now()
	f := newFixture(t, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	authURL, binding, _ := f.rp.Begin(context.Background(), "/", false)
	state, code := f.idp.authorize(t, authURL)
	mu.Lock()
	now = now.Add(2 * time.Minute) // past the token's expiry (1 minute), within the login's 10
	mu.Unlock()
	f.idp.mint = func(n string) string {
		return oidctest.SignIDToken(idpKey, "k1", "RS256", claims(f.idp.URL, "console", n, time.Now().Add(time.Minute), "oncall"))
	}
	_, err := f.rp.Finish(context.Background(), auth.Callback{State: state, Code: code, Binding: binding})
	if !errors.Is(err, auth.ErrLoginFailed) || f.count(t, "console_session") != 0 {
		t.Fatalf("want ErrLoginFailed and no session, got %v", err)
	}
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_event WHERE action = 'auth.login' AND error_code = 'token_expired'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the expired token is not audited (%d, %v)", n, err)
	}
}

// SECURITY.md case 2: no mapped group → no session, denial audited.
func TestNoMappedGroupIsDeniedAndAudited(t *testing.T) {
	t.Parallel()
	for _, groups := range [][]string{{"marketing"}, nil} {
		f := newFixture(t, nil)
		f.idp.mint = func(n string) string {
			return oidctest.SignIDToken(idpKey, "k1", "RS256", claims(f.idp.URL, "console", n, time.Now().Add(time.Hour), groups...))
		}
		_, err := f.login(t, "/", "")
		if !errors.Is(err, auth.ErrNoRole) {
			t.Fatalf("groups %v: want ErrNoRole, got %v", groups, err)
		}
		var outcome, code, sub string
		if err := f.pool.QueryRow(context.Background(), `SELECT outcome, error_code, actor_sub FROM audit_event WHERE action = 'auth.login'`).Scan(&outcome, &code, &sub); err != nil {
			t.Fatal(err)
		}
		if outcome != audit.OutcomeDenied || code != "no_mapped_role" || sub != "staff-1" || f.count(t, "console_session") != 0 {
			t.Fatalf("groups %v: audit %s/%s/%s, sessions %d", groups, outcome, code, sub, f.count(t, "console_session"))
		}
	}
}

// SECURITY.md case 3: the id held before login is worthless after it.
func TestSessionIDFromBeforeLoginIsUseless(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	first, err := f.login(t, "/", "")
	if err != nil {
		t.Fatal(err)
	}
	second, err := f.login(t, "/", first.Token)
	if err != nil {
		t.Fatal(err)
	}
	if first.Token == second.Token {
		t.Fatal("login reused the session id")
	}
	if _, err := f.sessions.Touch(context.Background(), first.Token); !errors.Is(err, auth.ErrNoSession) {
		t.Fatalf("old id still works: %v", err)
	}
	if _, err := f.sessions.Touch(context.Background(), second.Token); err != nil {
		t.Fatal(err)
	}
	// An id planted by an attacker (never issued) is never a session either.
	if _, err := f.sessions.Touch(context.Background(), "planted-by-attacker"); !errors.Is(err, auth.ErrNoSession) {
		t.Fatal(err)
	}
}

func TestSessionIdleAndAbsoluteExpiry(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	sessions := auth.NewSessions(f.pool, 2*time.Hour, 30*time.Minute, clock)
	l, err := f.login(t, "/", "")
	if err != nil {
		t.Fatal(err)
	}
	// The fixture's store stamped the session with the real clock; keep it alive with ours.
	ctx := context.Background()
	for i := 0; i < 3; i++ { // 75 minutes of activity every 25 minutes: alive
		advance(25 * time.Minute)
		if _, err := sessions.Touch(ctx, l.Token); err != nil {
			t.Fatalf("active session ended after %d touches: %v", i, err)
		}
	}
	advance(31 * time.Minute)
	if _, err := sessions.Touch(ctx, l.Token); !errors.Is(err, auth.ErrNoSession) {
		t.Fatalf("idle session still alive: %v", err)
	}
	l2, err := f.login(t, "/", "")
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = time.Now()
	mu.Unlock()
	for i := 0; i < 25; i++ { // active every 29 minutes, but past the 12h absolute lifetime
		advance(29 * time.Minute)
		_, err = sessions.Touch(ctx, l2.Token)
		if err != nil {
			break
		}
	}
	if !errors.Is(err, auth.ErrNoSession) {
		t.Fatalf("session outlived its absolute lifetime: %v", err)
	}
}
