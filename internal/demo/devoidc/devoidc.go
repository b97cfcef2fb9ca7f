// Package devoidc is the development OpenID Provider: a real OP (zitadel's
// op package) with an in-memory store, a username/password form and four
// demo users, one per console role. It binds to loopback only and serves
// the demo and the tests, never `console serve`.
package devoidc

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/zitadel/oidc/v3/pkg/op"
)

// Config of a development provider.
type Config struct {
	Addr           string // loopback host:port; port 0 picks one
	ClientID       string
	ClientSecret   string
	RedirectURIs   []string // the console's /auth/callback
	PostLogoutURIs []string
	// GroupsScopeOnly releases the groups claim only when the client asked
	// for the groups scope, as Dex, Keycloak's default client scopes and
	// Authelia do (tests sign in through this mode).
	GroupsScopeOnly bool
}

// DemoUsers are the logins the demo prints (password = user name) and their
// groups; the matching role map is DemoRoleMap.
var DemoUsers = []struct{ Username, Group string }{
	{"support", "support"},
	{"oncall", "oncall"},
	{"auditor", "audit"},
	{"admin", "sre"},
}

// RolesClaim is the ID token and userinfo claim that carries a demo user's
// groups (OIDC_ROLES_CLAIM of a console signing in through this provider).
const RolesClaim = "groups"

// DemoRoleMap maps the demo users' groups to console roles (CONSOLE_ROLE_MAP).
const DemoRoleMap = "support:viewer,oncall:operator,audit:auditor,sre:admin"

// Server is a running provider.
type Server struct {
	issuer   string
	srv      *http.Server
	store    *storage
	done     chan struct{}
	serveErr error
}

// Start listens on cfg.Addr (loopback only) and serves the provider.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	host, _, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("devoidc: address %q: %w", cfg.Addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("devoidc: refusing to listen on %q: the development provider binds to a loopback IP only", cfg.Addr)
	}
	if cfg.ClientID == "" || cfg.ClientSecret == "" || len(cfg.RedirectURIs) == 0 {
		return nil, errors.New("devoidc: client id, secret and redirect URIs are required")
	}
	store, err := newStorage(&client{id: cfg.ClientID, secret: cfg.ClientSecret, redirectURIs: cfg.RedirectURIs, postLogoutURIs: cfg.PostLogoutURIs})
	if err != nil {
		return nil, err
	}
	store.groupsScopeOnly = cfg.GroupsScopeOnly
	for _, u := range DemoUsers {
		store.addUser(&user{id: "demo-" + u.Username, username: u.Username, password: u.Username, groups: []string{u.Group}})
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("devoidc: listen: %w", err)
	}
	issuer := "http://" + ln.Addr().String()
	var cryptoKey [32]byte
	_, _ = rand.Read(cryptoKey[:])
	provider, err := op.NewProvider(&op.Config{
		CryptoKey:                cryptoKey,
		DefaultLogoutRedirectURI: "/signed-out",
		CodeMethodS256:           true,
		// Refresh tokens (with offline_access) let the console re-check a
		// signed-in user's groups; groups is listed so the console asks
		// for it, as it must with providers that release it only then.
		GrantTypeRefreshToken: true,
		SupportedScopes:       append(slices.Clone(op.DefaultSupportedScopes), scopeGroups),
	}, store, op.StaticIssuer(issuer), op.WithAllowInsecure())
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("devoidc: %w", err)
	}
	l := &loginPage{store: store, callback: op.AuthCallbackURL(provider)}
	interceptor := op.NewIssuerInterceptor(provider.IssuerFromRequest)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /login", l.show)
	mux.Handle("POST /login", interceptor.HandlerFunc(l.submit))
	mux.HandleFunc("GET /signed-out", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "signed out of the development provider")
	})
	mux.Handle("/", provider)
	s := &Server{
		issuer: issuer,
		store:  store,
		done:   make(chan struct{}),
		srv:    &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.serveErr = err
		}
	}()
	return s, nil
}

// Issuer is the provider's issuer URL (OIDC_ISSUER for the console).
func (s *Server) Issuer() string { return s.issuer }

// AddUser adds a login (tests use it for a user whose groups map to no role).
func (s *Server) AddUser(username, password string, groups ...string) {
	s.store.addUser(&user{id: "user-" + username, username: username, password: password, groups: groups})
}

// SetGroups replaces a user's groups (tests remove a user's group at the
// provider and watch the console end the session). It reports whether the
// user exists.
func (s *Server) SetGroups(username string, groups ...string) bool {
	s.store.mu.Lock()
	defer s.store.mu.Unlock()
	u, ok := s.store.users[username]
	if ok {
		u.groups = slices.Clone(groups)
	}
	return ok
}

// Close stops the provider.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	<-s.done
	return errors.Join(err, s.serveErr)
}

type loginPage struct {
	store    *storage
	callback func(context.Context, string) string
}

// The sign-in page is the first screen a newcomer sees; it carries its own
// small stylesheet and no script at all.
var loginTmpl = template.Must(template.New("login").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sign in · Sluice development provider</title>
<link rel="icon" href="data:,">
<style>
body{margin:0;min-height:100vh;display:flex;align-items:center;justify-content:center;background:#f6f7f9;color:#1f2328;font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif}
main{background:#fff;border:1px solid #d8dee4;border-radius:8px;padding:24px 28px;width:min(22rem,90vw)}
h1{font-size:18px;margin:0 0 2px}.sub{color:#59636e;margin:0 0 16px;font-size:13px}
label{display:block;font-weight:600;margin:10px 0 4px}
input{box-sizing:border-box;width:100%;padding:7px 9px;border:1px solid #d0d7de;border-radius:6px;font:inherit}
input:focus,button:focus{outline:2px solid #1f6feb;outline-offset:1px}
button{margin-top:16px;width:100%;padding:8px;border:0;border-radius:6px;background:#1f6feb;color:#fff;font:inherit;font-weight:600;cursor:pointer}
.err{background:#ffebe9;border:1px solid #ffc1bc;color:#a40e26;padding:6px 10px;border-radius:6px}
table{width:100%;border-collapse:collapse;margin-top:18px;font-size:12px;color:#59636e}
td{padding:3px 0;border-top:1px solid #eef0f2}code{color:#1f2328}
</style></head>
<body><main>
<h1>Sign in</h1>
<p class="sub">Sluice development identity provider — for the demo and tests only.</p>
{{if .Error}}<p class="err" role="alert" data-testid="login-error">{{.Error}}</p>{{end}}
<form method="post" action="/login">
<input type="hidden" name="id" value="{{.ID}}">
<label for="username">User name</label>
<input name="username" id="username" data-testid="username" autocomplete="username" autofocus required>
<label for="password">Password</label>
<input name="password" id="password" data-testid="password" type="password" autocomplete="current-password" required>
<button type="submit" id="submit" data-testid="submit">Sign in</button>
</form>
<table aria-label="Demo users">
<tr><td><code>support</code></td><td>viewer</td></tr>
<tr><td><code>oncall</code></td><td>operator</td></tr>
<tr><td><code>auditor</code></td><td>auditor</td></tr>
<tr><td><code>admin</code></td><td>admin</td></tr>
<tr><td colspan="2">The password is the user name.</td></tr>
</table>
</main></body></html>`))

func (l *loginPage) render(w http.ResponseWriter, id, msg string, status int) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	// No script on this page at all; inline styles only. No form-action:
	// browsers apply it to the redirect back to the console after sign-in.
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'; base-uri 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = loginTmpl.Execute(w, struct{ ID, Error string }{id, msg})
}

func (l *loginPage) show(w http.ResponseWriter, r *http.Request) {
	l.render(w, r.URL.Query().Get("authRequestID"), "", http.StatusOK)
}

func (l *loginPage) submit(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	id := r.PostFormValue("id")
	if err := l.store.checkLogin(id, r.PostFormValue("username"), r.PostFormValue("password")); err != nil {
		if errors.Is(err, errNotFound) {
			l.render(w, "", "This sign-in request is unknown or finished; start again from the console.", http.StatusBadRequest)
			return
		}
		l.render(w, id, "Wrong user name or password.", http.StatusUnauthorized)
		return
	}
	http.Redirect(w, r, l.callback(r.Context(), id), http.StatusFound)
}
