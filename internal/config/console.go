package config

import (
	"net"
	"net/url"
	"strings"
	"time"
)

// Console is the configuration of `console serve`.
type Console struct {
	Common
	Addr             string
	PublicURL        string
	MetricsAddr      string
	OIDCIssuer       string
	OIDCClientID     string
	OIDCClientSecret string
	RolesClaim       string
	RoleMap          string // group:role,... (parsed by internal/auth)
	SessionLifetime  time.Duration
	SessionIdle      time.Duration
	Tick             time.Duration
}

// RegisterConsole adds the console's flags.
func RegisterConsole(f *Flags, c *Console) {
	RegisterCommon(f, &c.Common)
	f.String(&c.Addr, "addr", "CONSOLE_ADDR", "127.0.0.1:8080", "console listen address")
	f.String(&c.PublicURL, "public-url", "CONSOLE_PUBLIC_URL", "http://127.0.0.1:8080", "external URL: the OIDC redirect URI and the websocket Origin allowlist derive from it")
	f.String(&c.MetricsAddr, "metrics-addr", "METRICS_ADDR", "", "separate listener for /metrics (empty: served on CONSOLE_ADDR)")
	f.String(&c.OIDCIssuer, "oidc-issuer", "OIDC_ISSUER", "", "OpenID Provider issuer URL")
	f.String(&c.OIDCClientID, "oidc-client-id", "OIDC_CLIENT_ID", "", "OIDC client id")
	f.String(&c.OIDCClientSecret, "oidc-client-secret", "OIDC_CLIENT_SECRET", "", "OIDC client secret")
	f.String(&c.RolesClaim, "oidc-roles-claim", "OIDC_ROLES_CLAIM", "groups", "ID token claim that carries group or role names")
	f.String(&c.RoleMap, "role-map", "CONSOLE_ROLE_MAP", "", "group:role,... (roles: viewer, operator, auditor, admin)")
	f.Duration(&c.SessionLifetime, "session-lifetime", "CONSOLE_SESSION_LIFETIME", 12*time.Hour, "absolute session lifetime")
	f.Duration(&c.SessionIdle, "session-idle", "CONSOLE_SESSION_IDLE", 30*time.Minute, "session idle timeout")
	f.Duration(&c.Tick, "live-tick", "CONSOLE_LIVE_TICK", time.Second, "dashboard snapshot interval")
}

// Validate checks the console's settings (the role map's syntax is checked
// by internal/auth when it is parsed).
func (c *Console) Validate() error {
	var ck Check
	c.Common.Validate(&ck)
	ck.Required("CONSOLE_ADDR", c.Addr)
	ck.Addr("CONSOLE_ADDR", c.Addr)
	ck.Addr("METRICS_ADDR", c.MetricsAddr)
	ck.Required("CONSOLE_PUBLIC_URL", c.PublicURL)
	ck.URL("CONSOLE_PUBLIC_URL", c.PublicURL, "http", "https")
	if u, err := url.Parse(c.PublicURL); err == nil && u.Scheme == "http" && !loopbackHost(u.Hostname()) {
		ck.Failf("CONSOLE_PUBLIC_URL: plain http is only allowed on loopback (got %q); use https", u.Host)
	}
	if u, err := url.Parse(c.PublicURL); err == nil && (u.Path != "" && u.Path != "/" || u.RawQuery != "") {
		ck.Failf("CONSOLE_PUBLIC_URL: must be an origin without a path (got %q)", c.PublicURL)
	}
	ck.Required("OIDC_ISSUER", c.OIDCIssuer)
	ck.URL("OIDC_ISSUER", c.OIDCIssuer, "https", "http")
	if u, err := url.Parse(c.OIDCIssuer); err == nil && u.Scheme == "http" && !loopbackHost(u.Hostname()) {
		ck.Failf("OIDC_ISSUER: plain http is only allowed on loopback (got %q); use https", u.Host)
	}
	ck.Required("OIDC_CLIENT_ID", c.OIDCClientID)
	ck.Required("OIDC_CLIENT_SECRET", c.OIDCClientSecret)
	ck.Required("OIDC_ROLES_CLAIM", c.RolesClaim)
	ck.Required("CONSOLE_ROLE_MAP", c.RoleMap)
	ck.PositiveDuration("CONSOLE_SESSION_LIFETIME", c.SessionLifetime)
	ck.PositiveDuration("CONSOLE_SESSION_IDLE", c.SessionIdle)
	ck.PositiveDuration("CONSOLE_LIVE_TICK", c.Tick)
	return ck.Err()
}

func loopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}
