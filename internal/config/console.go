package config

import (
	"slices"
	"strings"
	"time"

	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/payments/provider"
	"github.com/sluice-dev/sluice/web"
)

// Console is the configuration of `console serve`.
type Console struct {
	Common
	PIIKeys           // optional: with them, a permitted user may reveal one sealed field (audited)
	Addr              string
	PublicURL         string
	MetricsAddr       string
	OIDCIssuer        string
	OIDCClientID      string
	OIDCClientSecret  string
	RolesClaim        string
	RoleMap           string // group:role,... (parsed by internal/auth)
	SessionLifetime   time.Duration
	SessionIdle       time.Duration
	Tick              time.Duration
	OIDCScopes        string // empty: chosen from the provider's scopes_supported
	RoleRecheck       time.Duration
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	IdleTimeout       time.Duration
	WSPerSession      int
	LoginRate         int
	LoginPending      int
	WarnOldestPending time.Duration
	WarnReconcileAge  time.Duration
	WarnDead          int
	BulkRecentLogin   int
	RecentLogin       time.Duration
	RevealRoles       string      // CONSOLE_REVEAL_ROLES: role names, comma-separated
	RevealRoleList    []auth.Role // parsed by Validate
	FourEyesAbove     string      // a decimal amount
	ProviderURL       string      // empty: no inquiries from the console
	ProviderTimeout   time.Duration
	TraceURL          string // CONSOLE_TRACE_URL: a trace UI's URL with {trace_id}; empty: ids unlinked
	// PaymentsTopic is where the console's resolutions, approvals and
	// settlement lines write payment.* events: the topic payments-api
	// writes to (PAYMENTS_TOPIC), or its consumers miss them.
	PaymentsTopic string
}

// Register adds the console's flags; their defaults are the ones web.New,
// live.New and auth.NewRP apply to zero fields.
func (c *Console) Register(f *Flags) {
	c.Common.register(f)
	c.PIIKeys.register(f)
	registerTraceURL(f, &c.TraceURL)
	f.String(&c.Addr, "addr", "CONSOLE_ADDR", DefaultConsoleAddr, "console listen address")
	f.String(&c.PublicURL, "public-url", "CONSOLE_PUBLIC_URL", "http://"+DefaultConsoleAddr, "external URL: the OIDC redirect URI and the websocket Origin allowlist derive from it")
	f.String(&c.MetricsAddr, "metrics-addr", "METRICS_ADDR", "", "separate listener for /metrics (empty: served on CONSOLE_ADDR)")
	f.String(&c.OIDCIssuer, "oidc-issuer", "OIDC_ISSUER", "", "OpenID Provider issuer URL")
	f.String(&c.OIDCClientID, "oidc-client-id", "OIDC_CLIENT_ID", "", "OIDC client id")
	f.String(&c.OIDCClientSecret, "oidc-client-secret", "OIDC_CLIENT_SECRET", "", "OIDC client secret")
	f.String(&c.RolesClaim, "oidc-roles-claim", "OIDC_ROLES_CLAIM", auth.DefaultRolesClaim, "ID token claim that carries group or role names")
	f.String(&c.RoleMap, "role-map", "CONSOLE_ROLE_MAP", "", "group:role,... (roles: viewer, operator, auditor, admin)")
	f.Duration(&c.SessionLifetime, "session-lifetime", "CONSOLE_SESSION_LIFETIME", web.DefaultSessionLifetime, "absolute session lifetime")
	f.Duration(&c.SessionIdle, "session-idle", "CONSOLE_SESSION_IDLE", web.DefaultSessionIdle, "session idle timeout")
	f.Duration(&c.Tick, "live-tick", "CONSOLE_LIVE_TICK", live.DefaultInterval, "dashboard snapshot interval")
	f.String(&c.OIDCScopes, "oidc-scopes", "OIDC_SCOPES", "", "scopes to request, space-separated, used as given (empty: openid, plus profile, email, groups and offline_access when the provider lists them)")
	f.Duration(&c.RoleRecheck, "role-recheck", "CONSOLE_ROLE_RECHECK", web.DefaultRoleRecheck, "how often a session's roles are re-read from the provider (refresh token); a session whose roles are gone ends")
	f.Duration(&c.ReadHeaderTimeout, "read-header-timeout", "CONSOLE_READ_HEADER_TIMEOUT", web.DefaultReadHeaderTimeout, "time a client has to send a request's headers")
	f.Duration(&c.ReadTimeout, "read-timeout", "CONSOLE_READ_TIMEOUT", web.DefaultReadTimeout, "time a client has to send a request's body")
	f.Duration(&c.IdleTimeout, "idle-timeout", "CONSOLE_IDLE_TIMEOUT", web.DefaultIdleTimeout, "a kept-alive connection without a request is closed after this")
	f.Int(&c.WSPerSession, "ws-per-session", "CONSOLE_WS_PER_SESSION", web.DefaultWSPerSession, "open websockets allowed per session; one more is refused with 429")
	f.Int(&c.LoginRate, "login-rate", "CONSOLE_LOGIN_RATE", web.DefaultLoginRate, "sign-in requests (/login, /auth/callback) allowed per client IP per minute")
	f.Int(&c.LoginPending, "login-pending-max", "CONSOLE_LOGIN_PENDING_MAX", auth.DefaultMaxPendingLogins, "unexpired pending sign-ins allowed in all")
	f.Duration(&c.WarnOldestPending, "warn-oldest-pending", "CONSOLE_WARN_OLDEST_PENDING", web.DefaultWarnOldestPending, "the dashboard flags the oldest pending event from this age")
	f.Duration(&c.WarnReconcileAge, "warn-reconcile-age", "CONSOLE_WARN_RECONCILE_AGE", web.DefaultWarnReconcileAge, "the dashboard flags the oldest unknown payment from this age")
	f.Int(&c.WarnDead, "warn-dead", "CONSOLE_WARN_DEAD", web.DefaultWarnDead, "the dashboard flags dead letters from this many")
	f.Int(&c.BulkRecentLogin, "bulk-recent-login-above", "CONSOLE_BULK_RECENT_LOGIN_ABOVE", web.DefaultBulkRecentLogin, "a bulk action matching more events than this needs a recent sign-in (CONSOLE_RECENT_LOGIN)")
	f.String(&c.FourEyesAbove, "four-eyes-above", "CONSOLE_FOUR_EYES_ABOVE", web.DefaultFourEyesAbove, "resolving an unknown payment above this amount (typed, or by a line of a settlement file uploaded in the console) needs a second operator's approval")
	f.String(&c.ProviderURL, "provider-url", "PROVIDER_URL", "", "payment provider the console's inquire action asks (empty: no inquire action)")
	f.Duration(&c.ProviderTimeout, "provider-timeout", "PROVIDER_TIMEOUT", provider.DefaultTimeout, "give up on one provider inquiry after this long")
	f.String(&c.PaymentsTopic, "payments-topic", "PAYMENTS_TOPIC", payments.DefaultTopic, "outbox topic of the payment.* events the console's resolutions write (payments-api's PAYMENTS_TOPIC)")
	f.Duration(&c.RecentLogin, "recent-login", "CONSOLE_RECENT_LOGIN", web.DefaultRecentLogin, "how old a sign-in may be for actions that need a recent one; older: sign in again")
	f.String(&c.RevealRoles, "reveal-roles", "CONSOLE_REVEAL_ROLES", roleList(web.DefaultRevealRoles()), "console roles that may reveal one sealed personal-data field with a reason (audited)")
}

// Scopes splits OIDC_SCOPES (spaces or commas); nil when unset.
func (c *Console) Scopes() []string {
	return strings.FieldsFunc(c.OIDCScopes, func(r rune) bool { return r == ' ' || r == ',' })
}

// Validate checks the console's settings (the role map's syntax is checked
// by internal/auth when it is parsed).
func (c *Console) Validate() error {
	var ck Check
	c.Common.check(&ck)
	c.PIIKeys.check(&ck, false)
	ck.Required("CONSOLE_ADDR", c.Addr)
	ck.Required("PAYMENTS_TOPIC", c.PaymentsTopic)
	ck.Addr("CONSOLE_ADDR", c.Addr)
	ck.Addr("METRICS_ADDR", c.MetricsAddr)
	checkPublicURL(&ck, c.PublicURL)
	checkTraceURL(&ck, c.TraceURL)
	ck.Required("OIDC_ISSUER", c.OIDCIssuer)
	if ck.URL("OIDC_ISSUER", c.OIDCIssuer, "https", "http") {
		ck.Add(auth.CheckPlainHTTPOnLoopback("OIDC_ISSUER", c.OIDCIssuer))
	}
	ck.Required("OIDC_CLIENT_ID", c.OIDCClientID)
	ck.Required("OIDC_CLIENT_SECRET", c.OIDCClientSecret)
	ck.Required("OIDC_ROLES_CLAIM", c.RolesClaim)
	ck.Required("CONSOLE_ROLE_MAP", c.RoleMap)
	ck.PositiveDuration("CONSOLE_SESSION_LIFETIME", c.SessionLifetime)
	ck.PositiveDuration("CONSOLE_SESSION_IDLE", c.SessionIdle)
	ck.PositiveDuration("CONSOLE_LIVE_TICK", c.Tick)
	if sc := c.Scopes(); len(sc) > 0 {
		if !slices.Contains(sc, "openid") {
			ck.Failf("OIDC_SCOPES: must include openid (got %q)", c.OIDCScopes)
		}
		for _, s := range sc {
			if !validScope(s) {
				ck.Failf("OIDC_SCOPES: %q is not a scope token", s)
			}
		}
	}
	ck.PositiveDuration("CONSOLE_ROLE_RECHECK", c.RoleRecheck)
	ck.PositiveDuration("CONSOLE_READ_HEADER_TIMEOUT", c.ReadHeaderTimeout)
	ck.PositiveDuration("CONSOLE_READ_TIMEOUT", c.ReadTimeout)
	ck.PositiveDuration("CONSOLE_IDLE_TIMEOUT", c.IdleTimeout)
	ck.Positive("CONSOLE_WS_PER_SESSION", c.WSPerSession)
	ck.Positive("CONSOLE_LOGIN_RATE", c.LoginRate)
	ck.Positive("CONSOLE_LOGIN_PENDING_MAX", c.LoginPending)
	ck.PositiveDuration("CONSOLE_WARN_OLDEST_PENDING", c.WarnOldestPending)
	ck.PositiveDuration("CONSOLE_WARN_RECONCILE_AGE", c.WarnReconcileAge)
	ck.Positive("CONSOLE_WARN_DEAD", c.WarnDead)
	ck.Positive("CONSOLE_BULK_RECENT_LOGIN_ABOVE", c.BulkRecentLogin)
	if roles, err := auth.ParseRoles(c.RevealRoles); err != nil {
		ck.Failf("CONSOLE_REVEAL_ROLES: %v", err)
	} else {
		c.RevealRoleList = roles // empty: the console's default
	}
	ck.PositiveDuration("CONSOLE_RECENT_LOGIN", c.RecentLogin)
	if d, err := decimal.NewFromString(c.FourEyesAbove); err != nil || !d.IsPositive() {
		ck.Failf("CONSOLE_FOUR_EYES_ABOVE: %q is not a positive amount (write 5000.00)", c.FourEyesAbove)
	}
	if c.ProviderURL != "" {
		ck.URL("PROVIDER_URL", c.ProviderURL, "http", "https")
	}
	ck.PositiveDuration("PROVIDER_TIMEOUT", c.ProviderTimeout)
	return ck.Err()
}

// validScope: RFC 6749's scope-token (printable ASCII but space, " and \).
func validScope(s string) bool {
	for _, r := range s {
		if r < 0x21 || r > 0x7e || r == '"' || r == '\\' {
			return false
		}
	}
	return s != ""
}

func roleList(roles []auth.Role) string {
	names := make([]string, len(roles))
	for i, r := range roles {
		names[i] = string(r)
	}
	return strings.Join(names, ",")
}
