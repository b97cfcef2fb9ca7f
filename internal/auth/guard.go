package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/db"
)

// CookieSpec names the console's cookies. On https they are __Host-
// cookies (Secure, Path=/, no Domain); plain names without Secure are only
// allowed when the console's public URL is plain-http loopback (the demo).
type CookieSpec struct {
	Session string
	Login   string
	Secure  bool
}

// NewCookieSpec derives the cookie names from CONSOLE_PUBLIC_URL.
func NewCookieSpec(publicURL string) (CookieSpec, error) {
	u, err := url.Parse(publicURL)
	if err != nil || u.Host == "" {
		return CookieSpec{}, fmt.Errorf("CONSOLE_PUBLIC_URL: %q is not an absolute URL", publicURL)
	}
	switch u.Scheme {
	case "https":
		return CookieSpec{Session: "__Host-sluice", Login: "__Host-sluice-login", Secure: true}, nil
	case "http":
		if err := CheckPlainHTTPOnLoopback("CONSOLE_PUBLIC_URL", publicURL); err != nil {
			return CookieSpec{}, err
		}
		return CookieSpec{Session: "sluice_session", Login: "sluice_login"}, nil
	}
	return CookieSpec{}, fmt.Errorf("CONSOLE_PUBLIC_URL: scheme %q is not http or https", u.Scheme)
}

// CheckPlainHTTPOnLoopback is the one loopback rule, for every URL the
// console's sign-in trusts (CONSOLE_PUBLIC_URL, OIDC_ISSUER): plain http is
// allowed only on a loopback host (localhost, 127.0.0.0/8, ::1), where no
// network sits between browser and console; anywhere else it must be https,
// or session cookies and tokens would cross the network in the clear. It
// says nothing about other schemes or malformed URLs: the caller's form
// check reports those. The error names env.
func CheckPlainHTTPOnLoopback(env, rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "http" || loopbackHost(u.Hostname()) {
		return nil
	}
	return fmt.Errorf("%s: plain http is only allowed on loopback (got %q); use https", env, u.Host)
}

func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (cs CookieSpec) cookie(name, value string, maxAge time.Duration) *http.Cookie {
	c := &http.Cookie{Name: name, Value: value, Path: "/", HttpOnly: true, Secure: cs.Secure, SameSite: http.SameSiteLaxMode}
	switch {
	case maxAge > 0:
		c.MaxAge = int(maxAge.Seconds())
	case maxAge < 0:
		c.MaxAge = -1
	}
	return c
}

// SessionCookie sets (value != "") or clears the session cookie.
func (cs CookieSpec) SessionCookie(value string) *http.Cookie {
	if value == "" {
		return cs.cookie(cs.Session, "", -1)
	}
	return cs.cookie(cs.Session, value, 0) // a browser-session cookie; the server enforces lifetime
}

// LoginCookie sets (value != "") or clears the short-lived login binding.
func (cs CookieSpec) LoginCookie(value string, ttl time.Duration) *http.Cookie {
	if value == "" {
		return cs.cookie(cs.Login, "", -1)
	}
	return cs.cookie(cs.Login, value, ttl)
}

// Access is what a route requires. The route table declares one per route.
type Access struct {
	Public bool       // no session needed (health, login, static)
	Perm   Permission // required permission; "" means any signed-in user
	Page   bool       // an HTML page: anonymous GETs are sent to /login, not 401
	// MaxAuthAge, when set, needs a login no older than this (money-moving
	// actions): an older session gets ErrReauthRequired and signs in again.
	MaxAuthAge time.Duration
	// SignOut marks the sign-out route: a request whose cookie names a
	// session that has already ended (expired, idle, roles gone) goes
	// through without a session, so the handler can clear the stale
	// cookie and finish a normal sign-out. Without any cookie it is still
	// refused (there is nothing to sign out of).
	SignOut bool
}

// ErrReauthRequired means the action needs a more recent login.
var ErrReauthRequired = errors.New("auth: this action needs a recent login")

// Guard is the echo middleware that enforces Access on every route: it
// loads the session, checks the CSRF token on every unsafe method and the
// permission, and records every refusal: a signed-in user's in the audit
// chain, one without a session in the refusal log (refusal.go).
type Guard struct {
	Sessions *Sessions
	Pool     *pgxpool.Pool
	Cookies  CookieSpec
	Meta     func(c echo.Context) RequestMeta
	// Denied is told about each refusal (metrics); may be nil.
	Denied func(reason string)
	// Now is the clock for MaxAuthAge (nil: time.Now).
	Now func() time.Time
	// Roles re-checks a session's roles at the provider (nil: never).
	Roles *RoleCheck
	// Refusals logs refusals of requests without a session (nil: each one
	// is written to the refusal log, unlimited); they never enter the
	// audit chain.
	Refusals *Refusals

	deniedOnce sync.Once
	denied     *IPLimiter // audited refusals per session per minute (Denied)
}

// DeniedPerMinute is how many of one session's refusals a minute enter the
// audit chain one by one. Each is an append under the chain's lock, and a
// signed-in user (or a page of theirs) sending refused requests in a loop
// grew the chain and queued every operator's action behind the appends
// (a security review). Past it, one more row says the session is being
// refused faster, and the rest of that minute's refusals are counted in
// metrics only; the requests are refused all the same.
const DeniedPerMinute = 60

const sessionKey = "sluice.session"

// SessionFrom is the request's session (nil when anonymous).
func SessionFrom(c echo.Context) *Session {
	s, _ := c.Get(sessionKey).(*Session)
	return s
}

// load reads the session cookie (if any) and keeps the session on the
// context for the handlers; with recheck, roles older than the re-check
// interval are confirmed at the provider first. Public routes (static
// files, health) skip it.
func (g *Guard) load(c echo.Context, recheck bool) error {
	ck, err := c.Cookie(g.Cookies.Session)
	if err != nil || ck.Value == "" {
		return nil
	}
	sess, err := g.Sessions.Touch(c.Request().Context(), ck.Value)
	if err == nil && recheck {
		var meta RequestMeta
		if g.Meta != nil {
			meta = g.Meta(c)
		}
		sess, err = g.Roles.Check(c.Request().Context(), sess, meta)
	}
	switch {
	case err == nil:
		c.Set(sessionKey, sess)
	case errors.Is(err, ErrSessionEnded):
		// The request goes on as anonymous (refused below); the cookie
		// names nothing any more.
		c.SetCookie(g.Cookies.SessionCookie(""))
	case errors.Is(err, ErrProviderUnavailable):
		return echo.NewHTTPError(http.StatusServiceUnavailable).SetInternal(err)
	case !errors.Is(err, ErrNoSession):
		return err
	}
	return nil
}

// hasSessionCookie reports whether the request carries a session cookie
// at all (live or not).
func (g *Guard) hasSessionCookie(c echo.Context) bool {
	ck, err := c.Cookie(g.Cookies.Session)
	return err == nil && ck.Value != ""
}

func unsafeMethod(m string) bool {
	return m != http.MethodGet && m != http.MethodHead && m != http.MethodOptions
}

// Require enforces a on a route.
func (g *Guard) Require(a Access) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if a.Public {
				return next(c)
			}
			// Signing out needs no confirmed roles: it must work while the
			// provider is down, and it ends the session anyway.
			if err := g.load(c, !a.SignOut); err != nil {
				return err
			}
			req := c.Request()
			sess := SessionFrom(c)
			unsafe := unsafeMethod(req.Method)
			if sess == nil {
				if a.SignOut && g.hasSessionCookie(c) {
					return next(c)
				}
				if unsafe {
					return g.deny(c, nil, "no_session")
				}
				if a.Page && strings.Contains(req.Header.Get("Accept"), "text/html") && req.Header.Get("HX-Request") == "" {
					return c.Redirect(http.StatusSeeOther, "/login?next="+url.QueryEscape(SafeNext(req.URL.RequestURI())))
				}
				return echo.NewHTTPError(http.StatusUnauthorized)
			}
			if unsafe {
				// The token comes from the header or the form body only,
				// never the query string: a URL leaks through logs,
				// history and Referer.
				token := req.Header.Get("X-CSRF-Token")
				if token == "" {
					token = req.PostFormValue("csrf_token")
				}
				if !sess.CheckCSRF(token) {
					err := g.deny(c, sess, "csrf")
					var he *echo.HTTPError
					if errors.As(err, &he) && he.Code == http.StatusForbidden {
						// Not a missing permission: the refusal page says so.
						he.Internal = ErrCSRF
					}
					return err
				}
			}
			if a.Perm != "" && !sess.Can(a.Perm) {
				err := g.deny(c, sess, "permission")
				var he *echo.HTTPError
				if errors.As(err, &he) && he.Code == http.StatusForbidden {
					// The refusal page says which roles would do.
					he.Internal = &PermissionError{Need: a.Perm, Roles: sess.Roles}
				}
				return err
			}
			if a.MaxAuthAge > 0 {
				now := time.Now
				if g.Now != nil {
					now = g.Now
				}
				if now().Sub(sess.AuthTime) > a.MaxAuthAge {
					// deny answers 403 once the refusal is audited; any
					// other error (the audit failed) wins over the reauth.
					if err := g.deny(c, sess, "reauth"); !isForbidden(err) {
						return err
					}
					return ErrReauthRequired
				}
			}
			return next(c)
		}
	}
}

func (g *Guard) deny(c echo.Context, sess *Session, reason string) error {
	var meta RequestMeta
	if g.Meta != nil {
		meta = g.Meta(c)
	}
	route := c.Request().Method + " " + c.Path()
	var err error
	if sess == nil {
		err = g.refusals().Record(c.Request().Context(), meta, route, reason)
	} else {
		err = g.RecordDenied(c.Request().Context(), sess, meta, route, reason)
	}
	if err != nil {
		return err
	}
	if g.Denied != nil {
		g.Denied(reason)
	}
	return echo.NewHTTPError(http.StatusForbidden)
}

// RecordDenied audits sess's refused request as the package's RecordDenied
// does, up to DeniedPerMinute of the session's refusals a minute; the next
// one is audited with the code "rate_limited" (what was refused is in its
// path), and the others of that minute are not audited.
func (g *Guard) RecordDenied(ctx context.Context, sess *Session, meta RequestMeta, route, reason string) error {
	g.deniedOnce.Do(func() {
		now := g.Now
		if now == nil {
			now = time.Now
		}
		g.denied = NewIPLimiter(DeniedPerMinute, time.Minute, now)
	})
	switch n := g.denied.Take(sess.HashHex()); {
	case n == DeniedPerMinute+1:
		return recordDenied(ctx, g.Pool, sess, meta, route, reason, true)
	case n > DeniedPerMinute+1:
		return nil
	}
	return RecordDenied(ctx, g.Pool, sess, meta, route, reason)
}

// unrecordedNote is what the last audited refusal of a session's minute
// says in its after: the refusals that follow it are not in the chain.
const unrecordedNote = "this session's further refusals this minute are refused without an audit row each"

// RecordDenied audits a refused request (outcome denied) in its own
// transaction. route is the method and route template, never the raw URL.
func RecordDenied(ctx context.Context, pool *pgxpool.Pool, sess *Session, meta RequestMeta, route, reason string) error {
	return recordDenied(ctx, pool, sess, meta, route, reason, false)
}

// recordDenied is RecordDenied; last marks the session's last audited
// refusal of its minute (Guard.RecordDenied), whose after says so.
func recordDenied(ctx context.Context, pool *pgxpool.Pool, sess *Session, meta RequestMeta, route, reason string, last bool) error {
	ev := audit.Event{
		Action: "request.denied", TargetType: "route", TargetID: route,
		IP: meta.IP, UserAgent: meta.UserAgent, RequestID: meta.RequestID,
		Outcome: audit.OutcomeDenied, ErrorCode: reason,
	}
	if sess != nil {
		ev.ActorIss, ev.ActorSub, ev.ActorName, ev.ActorRoles = sess.Issuer, sess.Subject, sess.Name, sess.RoleNames()
		ev.SessionHash = sess.HashHex()
	}
	after := map[string]string{}
	if meta.Path != "" {
		after["path"] = meta.Path
	}
	if last {
		after["note"] = unrecordedNote
	}
	if len(after) > 0 {
		if b, err := json.Marshal(after); err == nil {
			ev.After = b
		}
	}
	// A cancelled request (the client went away) still leaves its trace.
	actx := context.WithoutCancel(ctx)
	return db.WithTx(actx, pool, func(tx pgx.Tx) error { return audit.Record(actx, tx, ev) })
}

// ErrCSRF is why a state-changing request without its session's CSRF
// token was refused: a form from before a sign-in, from another tab's old
// session, or not from the console at all.
var ErrCSRF = errors.New("auth: the request carries no valid CSRF token")

// PermissionError is a request refused because none of the session's
// roles has the route's permission (the error behind the 403).
type PermissionError struct {
	Need  Permission
	Roles []Role // the session's
}

func (e *PermissionError) Error() string {
	return fmt.Sprintf("auth: roles %v lack permission %s", e.Roles, e.Need)
}

func isForbidden(err error) bool {
	var he *echo.HTTPError
	return errors.As(err, &he) && he.Code == http.StatusForbidden
}
