package web_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/demo/devoidc"
	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/pii"
	"github.com/sluice-dev/sluice/web"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// countingQuerier counts the snapshot statements the feed runs: a batch
// (the snapshot with its plan setting, one round trip) or a single one.
type countingQuerier struct {
	q live.Querier
	n atomic.Int64
}

func (c *countingQuerier) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.n.Add(1)
	return c.q.QueryRow(ctx, sql, args...)
}

func (c *countingQuerier) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	c.n.Add(1)
	return c.q.SendBatch(ctx, b)
}

type harness struct {
	t       *testing.T
	pool    *pgxpool.Pool
	idp     *devoidc.Server
	app     *web.App
	base    string
	counter *countingQuerier
	metrics string // base URL of the separate metrics listener, if any
}

type options struct {
	tick    time.Duration
	recheck time.Duration
	metrics bool                            // serve /metrics on a separate listener (METRICS_ADDR)
	wrap    func(net.Listener) net.Listener // wraps the console's listener (socket options)
	clock   func() time.Time                // the console's clock (sessions, tokens, re-checks)
	// configure adjusts the console's configuration before it starts.
	configure func(*web.Config)
	// groupsScopeOnly: the provider releases groups only for the groups scope.
	groupsScopeOnly bool
	// jobHook runs in every bulk job chunk's transaction (web.Deps.JobHook).
	jobHook outbox.ChunkHook
	// keyring lets the console open sealed personal data (web.Deps.Keyring).
	keyring *pii.Keyring
}

// start runs the development provider and the real console on port 0.
func start(t *testing.T, o options) *harness {
	t.Helper()
	pool := dbtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	if o.wrap != nil {
		ln = o.wrap(ln)
	}
	var mln net.Listener
	metricsBase := ""
	if o.metrics {
		if mln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		metricsBase = "http://" + mln.Addr().String()
	}
	idp, err := devoidc.Start(ctx, devoidc.Config{
		Addr: "127.0.0.1:0", ClientID: "console", ClientSecret: "console-secret",
		RedirectURIs: []string{base + "/auth/callback"}, PostLogoutURIs: []string{base + "/signed-out"},
		GroupsScopeOnly: o.groupsScopeOnly,
	})
	if err != nil {
		t.Fatal(err)
	}
	rm, err := auth.ParseRoleMap(devoidc.DemoRoleMap)
	if err != nil {
		t.Fatal(err)
	}
	if o.tick == 0 {
		o.tick = 200 * time.Millisecond
	}
	// The console runs as the application role, as in production: it owns
	// nothing and may only INSERT and SELECT the audit trail and the ledger
	// (db.Grant). Tests keep the owner's pool for their fixtures.
	appPool := dbtest.AppRole(t, pool)
	counter := &countingQuerier{q: appPool}
	cfg := web.Config{
		PublicURL: base, OIDCIssuer: idp.Issuer(), OIDCClientID: "console", OIDCClientSecret: "console-secret",
		RolesClaim: "groups", RoleMap: rm, Tick: o.tick, SessionRecheck: o.recheck,
	}
	if o.configure != nil {
		o.configure(&cfg)
	}
	app, err := web.New(ctx, cfg, web.Deps{Pool: appPool, Listener: ln, MetricsListener: mln, SnapshotQuerier: counter, Now: o.clock,
		JobHook: o.jobHook, Keyring: o.keyring})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("app.Run: %v", err)
		}
		_ = idp.Close()
	})
	return &harness{t: t, pool: pool, idp: idp, app: app, base: base, counter: counter, metrics: metricsBase}
}

// recorder keeps every Set-Cookie the client received.
type recorder struct {
	mu      sync.Mutex
	cookies []*http.Cookie
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil {
		r.mu.Lock()
		r.cookies = append(r.cookies, resp.Cookies()...)
		r.mu.Unlock()
	}
	return resp, err
}

func (r *recorder) set(name string) []*http.Cookie {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*http.Cookie
	for _, c := range r.cookies {
		if c.Name == name {
			out = append(out, c)
		}
	}
	return out
}

type browser struct {
	*http.Client
	rec *recorder
}

func newBrowser(t *testing.T) *browser {
	jar, _ := cookiejar.New(nil)
	rec := &recorder{}
	return &browser{Client: &http.Client{Jar: jar, Transport: rec, Timeout: 20 * time.Second}, rec: rec}
}

var formID = regexp.MustCompile(`name="id" value="([^"]+)"`)

// login signs in through the real provider's form and returns the final
// response (body read) and its URL.
func (h *harness) login(t *testing.T, b *browser, user, password, next string) (*http.Response, string) {
	t.Helper()
	u := h.base + "/login"
	if next != "" {
		u += "?next=" + url.QueryEscape(next)
	}
	return h.signInAt(t, b, u, user, password)
}

// signInAt opens u (a console URL that leads to the provider's login form)
// and signs in there; it returns the final response (body read).
func (h *harness) signInAt(t *testing.T, b *browser, u, user, password string) (*http.Response, string) {
	t.Helper()
	resp, body := b.get(t, u, "text/html")
	m := formID.FindStringSubmatch(body)
	if resp.StatusCode != 200 || m == nil {
		t.Fatalf("no provider login form: %d %s", resp.StatusCode, body)
	}
	form := url.Values{"id": {m[1]}, "username": {user}, "password": {password}}
	req, _ := http.NewRequest(http.MethodPost, h.idp.Issuer()+"/login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "text/html")
	resp, err := b.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(data)
}

func (b *browser) get(t *testing.T, u, accept string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := b.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(data)
}

// logout signs b out as its Sign out button does (htmx's header, same
// origin), without following the redirect to the provider.
func (h *harness) logout(t *testing.T, b *browser, token string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.base+"/logout", nil)
	req.Header.Set("X-CSRF-Token", token)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := b.noRedirects().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

func (b *browser) noRedirects() *http.Client {
	c := *b.Client
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &c
}

func (b *browser) sessionCookie(base string) string {
	u, _ := url.Parse(base)
	for _, c := range b.Jar.Cookies(u) {
		if c.Name == "sluice_session" {
			return c.Value
		}
	}
	return ""
}

func (h *harness) countRefusals(t *testing.T, where string, args ...any) int {
	t.Helper()
	var n int
	if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM console_refusal WHERE `+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (h *harness) countAudit(t *testing.T, where string, args ...any) int {
	t.Helper()
	var n int
	if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_event WHERE `+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
