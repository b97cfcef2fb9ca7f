package web

import (
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/views"
)

const loginTTL = 10 * time.Minute

// login starts the code flow: one-time state, nonce and PKCE verifier kept
// server-side, bound to this browser by a short-lived cookie.
func (a *App) login(c echo.Context) error {
	if err := a.loginAllowed(c); err != nil {
		return err
	}
	authURL, binding, err := a.rp.Begin(c.Request().Context(), c.QueryParam("next"), c.QueryParam("reauth") == "1")
	if errors.Is(err, auth.ErrTooManyLogins) {
		a.log.Warn("sign-in refused: the cap on pending logins is reached", "cap", a.cfg.LoginPending)
		return tooManySignIns(c)
	}
	if err != nil {
		return err
	}
	c.SetCookie(a.cookies.LoginCookie(binding, loginTTL))
	return c.Redirect(http.StatusFound, authURL)
}

// callback finishes the flow. On any failure no session cookie is set.
func (a *App) callback(c echo.Context) error {
	if err := a.loginAllowed(c); err != nil {
		return err
	}
	cb := auth.Callback{
		State: c.QueryParam("state"), Code: c.QueryParam("code"), Error: c.QueryParam("error"),
		Meta: requestMeta(c),
	}
	if ck, err := c.Cookie(a.cookies.Login); err == nil {
		cb.Binding = ck.Value
	}
	if ck, err := c.Cookie(a.cookies.Session); err == nil {
		cb.OldSession = ck.Value
	}
	c.SetCookie(a.cookies.LoginCookie("", 0)) // one attempt per binding, whatever happens
	l, err := a.rp.Finish(c.Request().Context(), cb)
	switch {
	case err == nil:
		a.metrics.actions.WithLabelValues("auth.login", audit.OutcomeOK).Inc()
	case statusOf(err) == http.StatusForbidden:
		a.metrics.actions.WithLabelValues("auth.login", audit.OutcomeDenied).Inc()
		return err
	default:
		a.metrics.actions.WithLabelValues("auth.login", audit.OutcomeError).Inc()
		return err
	}
	c.SetCookie(a.cookies.SessionCookie(l.Token))
	return c.Redirect(http.StatusSeeOther, l.Next)
}

// logout ends the session, closes its websockets and sends the browser to
// the provider's end_session_endpoint (when it has one).
func (a *App) logout(c echo.Context) error {
	sess := auth.SessionFrom(c)
	if sess == nil {
		// The session had already ended (expired, idle, roles gone): the
		// sign-out still clears the stale cookie and ends the provider's
		// session, as a normal one would.
		c.SetCookie(a.cookies.SessionCookie(""))
		return c.Redirect(http.StatusSeeOther, a.rp.SignOutURL(""))
	}
	to, err := a.rp.Logout(c.Request().Context(), sess, requestMeta(c))
	if err != nil {
		return err
	}
	a.feed.CloseSession(sess.HashHex())
	a.metrics.actions.WithLabelValues("auth.logout", audit.OutcomeOK).Inc()
	c.SetCookie(a.cookies.SessionCookie(""))
	return c.Redirect(http.StatusSeeOther, to)
}

// loginAllowed counts a sign-in request against its client IP's limit.
// Both ends of the flow write rows (a pending login, or the audit of a
// failed one), so both count.
func (a *App) loginAllowed(c echo.Context) error {
	if a.logins.Allow(c.RealIP()) {
		return nil
	}
	return tooManySignIns(c)
}

func tooManySignIns(c echo.Context) error {
	c.Response().Header().Set("Retry-After", "60")
	return errTooManySignIns
}

// signedOut is where the provider sends the browser after a sign-out. A
// browser that still holds a live session (a bookmark, the back button, a
// sign-out in another console tab that failed) goes to the dashboard: the
// page must not say a session ended that has not. Peek, not Touch: looking
// is not activity.
func (a *App) signedOut(c echo.Context) error {
	if ck, err := c.Cookie(a.cookies.Session); err == nil && ck.Value != "" {
		if _, err := a.sessions.Peek(c.Request().Context(), ck.Value); err == nil {
			return c.Redirect(http.StatusSeeOther, "/")
		}
	}
	return render(c, http.StatusOK, views.SignedOut())
}
