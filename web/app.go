// Package web is the console's HTTP side: echo handlers (one file per
// screen or action), the route table (routes.go, every route declares the
// access it needs) and the one error handler (errors.go).
package web

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/shopspring/decimal"

	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/payments/provider"
	"github.com/sluice-dev/sluice/internal/pii"
	"github.com/sluice-dev/sluice/views"
)

// Config is the console's configuration (see internal/config.Console).
type Config struct {
	Addr             string // CONSOLE_ADDR (ignored when Deps.Listener is set)
	PublicURL        string // CONSOLE_PUBLIC_URL
	MetricsAddr      string // METRICS_ADDR: empty serves /metrics on Addr
	OIDCIssuer       string
	OIDCClientID     string
	OIDCClientSecret string
	RolesClaim       string
	RoleMap          auth.RoleMap
	SessionLifetime  time.Duration // absolute (default 12h)
	SessionIdle      time.Duration // idle timeout (default 30m)
	SessionRecheck   time.Duration // how often an open websocket re-checks its session (default 30s)
	Tick             time.Duration // live snapshot interval (default 1s)
	BodyLimit        string        // request body limit (default "64K")
	// OIDCScopes (OIDC_SCOPES) are requested as given; empty: chosen from
	// the provider's scopes_supported (auth.ChooseScopes).
	OIDCScopes []string
	// RoleRecheck (CONSOLE_ROLE_RECHECK) is how old a session's roles may
	// get before the provider is asked again (default 5m).
	RoleRecheck time.Duration
	// The door's timeouts: request headers must arrive within
	// ReadHeaderTimeout, a request body within ReadTimeout of the request's
	// start (websockets have no body and keep their own deadlines), and a
	// kept-alive connection is closed after IdleTimeout without a request.
	ReadHeaderTimeout time.Duration // CONSOLE_READ_HEADER_TIMEOUT (default 10s)
	ReadTimeout       time.Duration // CONSOLE_READ_TIMEOUT (default 30s)
	IdleTimeout       time.Duration // CONSOLE_IDLE_TIMEOUT (default 2m)
	// WSPerSession (CONSOLE_WS_PER_SESSION) caps the open websockets of one
	// session (default 8); one more is refused with 429 before the upgrade.
	WSPerSession int
	// LoginRate (CONSOLE_LOGIN_RATE) is how many sign-in requests (GET
	// /login and GET /auth/callback) one client IP may make per minute
	// (default 60); LoginPending (CONSOLE_LOGIN_PENDING_MAX) caps the
	// unexpired pending logins of all clients (default 10000). Over either:
	// 429, and no row is written.
	LoginRate    int
	LoginPending int
	// The dashboard's warning thresholds: a tile turns orange at them.
	// WarnOldestPending (CONSOLE_WARN_OLDEST_PENDING, default 5m) and
	// WarnReconcileAge (CONSOLE_WARN_RECONCILE_AGE, default 15m) are ages;
	// WarnDead (CONSOLE_WARN_DEAD, default 1) is the number of dead letters
	// from which the tile warns.
	WarnOldestPending time.Duration
	WarnReconcileAge  time.Duration
	WarnDead          int64
	// A bulk action matching more than BulkRecentLoginAbove events
	// (CONSOLE_BULK_RECENT_LOGIN_ABOVE, default 1000) needs a sign-in no
	// older than RecentLogin (CONSOLE_RECENT_LOGIN, default 15m).
	BulkRecentLoginAbove int
	RecentLogin          time.Duration
	// RevealRoles may reveal one sealed personal-data field with a reason
	// (CONSOLE_REVEAL_ROLES; default DefaultRevealRoles: operator, admin).
	RevealRoles []auth.Role
	// FourEyesAbove (CONSOLE_FOUR_EYES_ABOVE, default DefaultFourEyesAbove)
	// is the amount above which an operator's resolve is a request that a
	// different operator approves. Resolve and approve also need a sign-in
	// no older than RecentLogin.
	FourEyesAbove decimal.Decimal
	// ProviderURL (PROVIDER_URL) is the payment provider the "inquire"
	// action asks, each call bounded by ProviderTimeout (PROVIDER_TIMEOUT,
	// default provider.DefaultTimeout). Empty: no inquire button, and the
	// route answers 503.
	ProviderURL     string
	ProviderTimeout time.Duration
	// PaymentsTopic is the outbox topic of payment.* events a resolution
	// writes (default payments.DefaultTopic).
	PaymentsTopic string
	// TraceURL (CONSOLE_TRACE_URL) is a trace UI's address with {trace_id}
	// in it, e.g. https://jaeger.example/trace/{trace_id}: the trace page
	// links each trace id there. Empty: the ids are shown to copy, unlinked.
	TraceURL string
}

// Defaults of Config, applied to zero fields by New; `console serve` shows
// them as its flag defaults. The live tick's default is live.DefaultInterval,
// the pending-login cap's auth.DefaultMaxPendingLogins.
const (
	DefaultSessionLifetime   = 12 * time.Hour
	DefaultSessionIdle       = 30 * time.Minute
	DefaultSessionRecheck    = 30 * time.Second
	DefaultBodyLimit         = "64K"
	DefaultRoleRecheck       = 5 * time.Minute
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	DefaultWSPerSession      = 8
	DefaultLoginRate         = 60
	DefaultWarnOldestPending = 5 * time.Minute
	DefaultWarnReconcileAge  = 15 * time.Minute
	DefaultWarnDead          = 1
	DefaultBulkRecentLogin   = 1000
	DefaultRecentLogin       = 15 * time.Minute
	DefaultFourEyesAbove     = "10000.00"
	// RevealsPerMinute bounds one user's reveals of personal data: enough
	// for support reading a case, too few to page through customers.
	RevealsPerMinute = 10
	// SearchesPerMinute bounds one user's searches by customer: an exact
	// match answers whether a guess is right, and the masks give part of
	// each value away, so a viewer who may not reveal could otherwise
	// confirm the rest by trying candidates (a security review did, 40 in
	// a row). Enough for support retyping a caller's address.
	SearchesPerMinute = 20
)

// DefaultRevealRoles may reveal personal data unless CONSOLE_REVEAL_ROLES
// says otherwise: the roles DESIGN.md's table gives the reveal permission
// (on-call and admins, never support or auditors).
func DefaultRevealRoles() []auth.Role { return auth.RolesWith(auth.PermRevealPII) }

// Deps are the parts the console is built from.
type Deps struct {
	Pool     *pgxpool.Pool
	Logger   *slog.Logger
	Registry *prometheus.Registry // nil: a fresh one
	Listener net.Listener         // optional: an already bound listener (tests, the demo)
	// MetricsListener, when set, serves /metrics instead of METRICS_ADDR
	// (and /metrics leaves the main listener, as with METRICS_ADDR).
	MetricsListener net.Listener
	// SnapshotQuerier reads the live snapshot (nil: Pool). Tests wrap it to
	// count statements.
	SnapshotQuerier live.Querier
	// OIDCHTTPClient talks to the provider (nil: a client with a timeout).
	OIDCHTTPClient *http.Client
	// Now is the clock of sessions and the ID token verifier (nil: time.Now).
	Now func() time.Time
	// JobHook, when set, runs in every bulk job chunk's transaction after
	// the console's own (tests pause or fail chunks with it).
	JobHook outbox.ChunkHook
	// Keyring opens sealed personal data for a permitted reveal (PII_KEYS;
	// nil: the console holds no keys, shows sealed values as sealed and
	// offers no reveal).
	Keyring *pii.Keyring
	// VerifyEvery is how many rows a console chain verification walks
	// between progress updates (0: audit.VerifyEvery).
	VerifyEvery int64
	// Tracing (nil: none) makes a server span per request, so the outbox
	// events an action writes carry its trace context.
	Tracing trace.TracerProvider
}

// App is a built console.
type App struct {
	cfg      Config
	pool     *pgxpool.Pool
	log      *slog.Logger
	e        *echo.Echo
	handler  http.Handler
	origin   string // scheme://host of PublicURL: the websocket Origin allowlist
	cookies  auth.CookieSpec
	sessions *auth.Sessions
	rp       *auth.RP
	guard    *auth.Guard
	feed     *live.Feed
	reg      *prometheus.Registry
	metrics  *metrics
	ln       net.Listener
	mln      net.Listener
	now      func() time.Time
	roles    *auth.RoleCheck
	logins   *auth.IPLimiter
	jobs     *outbox.JobRunner
	kr       *pii.Keyring
	tracer   trace.Tracer      // nil: tracing off
	reveals  *auth.IPLimiter   // reveals per user per minute
	searches *auth.IPLimiter   // customer searches per user per minute
	verifier *verifier         // chain verifications asked for from the console (audit_verify.go)
	inquirer *payments.Service // nil: no provider configured
	links    views.Links       // which pages exist, so only those are linked

	wsMu   sync.Mutex
	wsOpen map[string]int // open websockets per session hash

	mu      sync.Mutex
	servers []*http.Server
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// New builds the console: it discovers the OIDC provider, so the provider
// must be reachable.
func New(ctx context.Context, cfg Config, deps Deps) (*App, error) {
	if deps.Pool == nil {
		return nil, errors.New("web: no database pool")
	}
	if cfg.SessionLifetime <= 0 {
		cfg.SessionLifetime = DefaultSessionLifetime
	}
	if cfg.SessionIdle <= 0 {
		cfg.SessionIdle = DefaultSessionIdle
	}
	if cfg.SessionRecheck <= 0 {
		cfg.SessionRecheck = DefaultSessionRecheck
	}
	if cfg.BodyLimit == "" {
		cfg.BodyLimit = DefaultBodyLimit
	}
	if cfg.RoleRecheck <= 0 {
		cfg.RoleRecheck = DefaultRoleRecheck
	}
	if cfg.ReadHeaderTimeout <= 0 {
		cfg.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.WSPerSession <= 0 {
		cfg.WSPerSession = DefaultWSPerSession
	}
	if cfg.LoginRate <= 0 {
		cfg.LoginRate = DefaultLoginRate
	}
	if cfg.LoginPending <= 0 {
		cfg.LoginPending = auth.DefaultMaxPendingLogins
	}
	if cfg.WarnOldestPending <= 0 {
		cfg.WarnOldestPending = DefaultWarnOldestPending
	}
	if cfg.WarnReconcileAge <= 0 {
		cfg.WarnReconcileAge = DefaultWarnReconcileAge
	}
	if cfg.WarnDead <= 0 {
		cfg.WarnDead = DefaultWarnDead
	}
	if cfg.BulkRecentLoginAbove <= 0 {
		cfg.BulkRecentLoginAbove = DefaultBulkRecentLogin
	}
	if cfg.RecentLogin <= 0 {
		cfg.RecentLogin = DefaultRecentLogin
	}
	if len(cfg.RevealRoles) == 0 {
		cfg.RevealRoles = DefaultRevealRoles()
	}
	if !cfg.FourEyesAbove.IsPositive() {
		cfg.FourEyesAbove = decimal.RequireFromString(DefaultFourEyesAbove)
	}
	if cfg.ProviderTimeout <= 0 {
		cfg.ProviderTimeout = provider.DefaultTimeout
	}
	if cfg.PaymentsTopic == "" {
		cfg.PaymentsTopic = payments.DefaultTopic
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.Registry == nil {
		deps.Registry = prometheus.NewRegistry()
	}
	pub, err := url.Parse(cfg.PublicURL)
	if err != nil || pub.Host == "" {
		return nil, fmt.Errorf("CONSOLE_PUBLIC_URL: %q is not an absolute URL", cfg.PublicURL)
	}
	cookies, err := auth.NewCookieSpec(cfg.PublicURL)
	if err != nil {
		return nil, err
	}
	a := &App{
		cfg: cfg, pool: deps.Pool, log: deps.Logger, cookies: cookies, reg: deps.Registry,
		origin: originOf(pub), ln: deps.Listener, mln: deps.MetricsListener, now: deps.Now,
		wsOpen: map[string]int{}, logins: auth.NewIPLimiter(cfg.LoginRate, time.Minute, deps.Now),
		kr: deps.Keyring, tracer: requestTracer(deps.Tracing), reveals: auth.NewIPLimiter(RevealsPerMinute, time.Minute, deps.Now),
		searches: auth.NewIPLimiter(SearchesPerMinute, time.Minute, deps.Now),
	}
	a.sessions = auth.NewSessions(deps.Pool, cfg.SessionLifetime, cfg.SessionIdle, deps.Now)
	a.rp, err = auth.NewRP(ctx, auth.RPConfig{
		Issuer: cfg.OIDCIssuer, ClientID: cfg.OIDCClientID, ClientSecret: cfg.OIDCClientSecret,
		RedirectURL: a.origin + "/auth/callback", PostLogout: a.origin + "/signed-out",
		RolesClaim: cfg.RolesClaim, RoleMap: cfg.RoleMap, HTTPClient: deps.OIDCHTTPClient, Now: deps.Now,
		Scopes: cfg.OIDCScopes, MaxPendingLogins: cfg.LoginPending,
	}, deps.Pool, a.sessions)
	if err != nil {
		return nil, err
	}
	if a.metrics, err = newMetrics(a.reg); err != nil {
		return nil, err
	}
	// A registry shared with other parts of the process may have it already.
	if err := db.RegisterAll(a.reg, collectors.NewGoCollector()); err != nil {
		return nil, err
	}
	q := deps.SnapshotQuerier
	if q == nil {
		q = deps.Pool
	}
	a.feed = live.New(q, deps.Pool, live.Config{Interval: cfg.Tick, Render: a.renderLive, Logger: deps.Logger})
	if err := a.feed.Register(a.reg); err != nil {
		return nil, err
	}
	if a.jobs, err = a.newJobRunner(deps.JobHook); err != nil {
		return nil, err
	}
	a.verifier = newVerifier(deps.Pool, deps.Logger, deps.VerifyEvery, a.feed.Poke)
	a.roles = &auth.RoleCheck{RP: a.rp, Every: cfg.RoleRecheck, Now: deps.Now, Ended: func(hash string) {
		a.feed.CloseSession(hash)
		a.metrics.actions.WithLabelValues("auth.role_recheck", "denied").Inc()
	}}
	a.guard = &auth.Guard{
		Sessions: a.sessions, Pool: deps.Pool, Cookies: cookies, Meta: requestMeta, Now: deps.Now, Roles: a.roles,
		Denied:   func(reason string) { a.metrics.actions.WithLabelValues("request", "denied").Inc() },
		Refusals: auth.NewRefusals(deps.Pool, deps.Now, func(reason string) { a.metrics.refusals.WithLabelValues(reason).Inc() }),
	}
	if cfg.ProviderURL != "" {
		a.inquirer, err = payments.NewInquirer(deps.Pool, provider.NewClient(cfg.ProviderURL, cfg.ProviderTimeout),
			payments.Config{Topic: cfg.PaymentsTopic}, deps.Logger, nil)
		if err != nil {
			return nil, err
		}
	}
	a.e = a.newEcho()
	a.links = views.Links{
		Outbox: a.serves("/outbox"), OutboxEvent: a.serves("/outbox/x"), Payment: a.serves("/payments/x"),
		Payments: a.serves("/payments"), Inbox: a.serves("/inbox"), Audit: a.serves("/audit"),
		Jobs: a.serves("/jobs"), Approvals: a.serves("/approvals"), Trace: a.serves("/trace/event/x"),
		Relays: a.serves("/relays"), Discrepancies: a.serves("/payments/discrepancies"),
	}
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(a.crossOriginDenied))
	a.handler = a.onlyKnownMethods(a.bodyDeadline(cop.Handler(a.e)))
	return a, nil
}

// serves reports whether GET path reaches a page of the route table: the
// navigation, the dashboard and the banner link only to pages that exist.
func (a *App) serves(path string) bool {
	c := a.e.NewContext(nil, nil)
	a.e.Router().Find(http.MethodGet, path, c)
	return c.Path() != "" && c.Path() != "/static/*"
}

// Handler is the console's whole HTTP handler (cross-origin protection in
// front of echo).
func (a *App) Handler() http.Handler { return a.handler }

// Feed is the live feed (the demo and tests read its stats).
func (a *App) Feed() *live.Feed { return a.feed }

// Run serves until ctx ends, then shuts down gracefully.
func (a *App) Run(ctx context.Context) error {
	ln := a.ln
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", a.cfg.Addr); err != nil {
			return fmt.Errorf("CONSOLE_ADDR: listen: %w", err)
		}
	}
	mln := a.mln
	if mln == nil && a.cfg.MetricsAddr != "" {
		var err error
		if mln, err = net.Listen("tcp", a.cfg.MetricsAddr); err != nil {
			ln.Close()
			return fmt.Errorf("METRICS_ADDR: listen: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.mu.Lock()
	a.cancel = cancel
	a.mu.Unlock()
	errc := make(chan error, 2)
	serve := func(l net.Listener, h http.Handler) {
		// No WriteTimeout (it would cut websockets); ReadTimeout is applied
		// per request to bodies only (bodyDeadline), because the server's
		// own ReadTimeout also cancels a handler's context once the body is
		// read.
		srv := &http.Server{Handler: h, ReadHeaderTimeout: a.cfg.ReadHeaderTimeout, IdleTimeout: a.cfg.IdleTimeout,
			BaseContext: func(net.Listener) context.Context { return ctx }}
		a.mu.Lock()
		a.servers = append(a.servers, srv)
		a.mu.Unlock()
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	serve(ln, a.handler)
	if mln != nil {
		serve(mln, a.onlyKnownMethods(a.bodyDeadline(a.metricsOnly())))
	}
	a.wg.Add(4)
	go func() { defer a.wg.Done(); _ = a.feed.Run(ctx) }()
	go func() { defer a.wg.Done(); a.verifier.Run(ctx) }()
	go func() { defer a.wg.Done(); _ = a.jobs.Run(ctx) }()
	go func() { defer a.wg.Done(); a.purgeLoop(ctx) }()
	a.log.Info("console listening", "addr", ln.Addr().String(), "public_url", a.cfg.PublicURL)
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	err = errors.Join(err, a.Close())
	a.wg.Wait() // the feed, the purge loop and the servers have stopped
	return err
}

// Close stops Run: the servers shut down gracefully and the feed closes
// every websocket (code 1012: the browsers reconnect to the next process).
func (a *App) Close() error {
	a.mu.Lock()
	servers := a.servers
	a.servers = nil
	if a.cancel != nil {
		a.cancel()
	}
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var errs []error
	for _, s := range servers {
		if err := s.Shutdown(ctx); err != nil {
			errs = append(errs, s.Close())
		}
	}
	return errors.Join(errs...)
}

func (a *App) purgeLoop(ctx context.Context) {
	t := time.NewTicker(5 * time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := a.sessions.Purge(ctx); err != nil && ctx.Err() == nil {
				a.log.Warn("session purge failed", "err", err)
			}
		}
	}
}

func (a *App) metricsHandler() http.Handler {
	return promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{})
}

// separateMetrics reports whether /metrics has its own listener.
func (a *App) separateMetrics() bool { return a.cfg.MetricsAddr != "" || a.mln != nil }

// metricsOnly is the separate metrics listener's handler: /metrics and
// nothing else, so that port never answers for the console's pages.
func (a *App) metricsOnly() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", a.metricsHandler())
	return mux
}

// Routes lists the registered routes as "METHOD /path" (tests check that
// each one refuses anonymous callers unless the route table says public).
func (a *App) Routes() []string {
	var out []string
	for _, r := range a.e.Routes() {
		out = append(out, r.Method+" "+r.Path)
	}
	return out
}

func (a *App) newEcho() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	// Behind no proxy by default: the peer address is the client. (A proxy
	// deployment would configure its trusted ranges here.)
	e.IPExtractor = echo.ExtractIPDirect()
	e.HTTPErrorHandler = a.handleError
	e.Use(middleware.Recover())
	e.Use(requestID)
	e.Use(a.traced)
	e.Use(a.securityHeaders)
	e.Use(a.metrics.middleware)
	e.Use(refuseOptions)
	// A settlement file may be larger than any form: its route alone gets
	// maxSettlementUpload (plus the multipart envelope).
	e.Use(middleware.BodyLimitWithConfig(middleware.BodyLimitConfig{Limit: a.cfg.BodyLimit, Skipper: isSettlementUpload}))
	e.Use(middleware.BodyLimitWithConfig(middleware.BodyLimitConfig{Limit: settlementBodyLimit,
		Skipper: func(c echo.Context) bool { return !isSettlementUpload(c) }}))
	for _, r := range a.routes() {
		e.Add(r.method, r.path, r.handler, a.guard.Require(r.access))
	}
	return e
}

// refuseOptions answers OPTIONS with 405, as every other method a route
// does not take: echo would answer it itself, 204 with the route's methods,
// before any guard, to anyone. The console serves no cross-origin caller,
// so it has no preflight to answer.
func refuseOptions(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if c.Request().Method == http.MethodOptions {
			return echo.ErrMethodNotAllowed
		}
		return next(c)
	}
}

// originOf serializes u's origin the way browsers send it in the Origin
// header (lower case, no default port), so the websocket's exact match
// does not refuse every browser when CONSOLE_PUBLIC_URL is spelled
// https://Console.Example.com:443.
func originOf(u *url.URL) string {
	scheme, host, port := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname()), u.Port()
	if scheme == "https" && port == "443" || scheme == "http" && port == "80" {
		port = ""
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]" // IPv6 literal
	}
	if port != "" {
		host += ":" + port
	}
	return scheme + "://" + host
}

func requestMeta(c echo.Context) auth.RequestMeta {
	ua := c.Request().UserAgent()
	if len(ua) > 512 {
		// Cut on a rune boundary: half a character is invalid UTF-8.
		n := 512
		for n > 0 && !utf8.RuneStart(ua[n]) {
			n--
		}
		ua = ua[:n]
	}
	// Escaped: ASCII whatever the client sent (a NUL or invalid UTF-8
	// would make the audit row's jsonb refuse it, and the refusal go
	// unrecorded).
	path := c.Request().URL.EscapedPath()
	if len(path) > auth.MaxMetaPath {
		path = path[:auth.MaxMetaPath]
	}
	return auth.RequestMeta{IP: c.RealIP(), UserAgent: ua, RequestID: requestIDOf(c), Path: path}
}
