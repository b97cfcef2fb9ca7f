package web

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/a-h/templ"
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/views"
)

// The error taxonomy of STYLE.md. Handlers wrap domain errors in these (or
// return an *echo.HTTPError); handleError turns them into a status.
var (
	ErrNotFound   = errors.New("not found")        // 404
	ErrConflict   = errors.New("conflict")         // 409
	ErrForbidden  = errors.New("forbidden")        // 403
	ErrBadRequest = errors.New("bad request")      // 400
	ErrInvalid    = errors.New("validation error") // 422

	errTooManySignIns = echo.NewHTTPError(http.StatusTooManyRequests,
		"Too many sign-ins were started from your address or are in progress. Wait a minute, then try again.")
)

// publicError is an error whose message is written for the user (the
// error page shows it instead of the status's generic sentence).
type publicError struct {
	status int
	msg    string
}

func (e *publicError) Error() string { return e.msg }

// badRequest is a 400 that says what is wrong.
func badRequest(msg string) error { return &publicError{status: http.StatusBadRequest, msg: msg} }

// shownError carries a message written for the user (what conflicted and
// why); its status comes from the error it wraps.
type shownError struct {
	err error
	msg string
}

func (e *shownError) Error() string { return e.err.Error() }
func (e *shownError) Unwrap() error { return e.err }

func statusOf(err error) int {
	var (
		he *echo.HTTPError
		pe *publicError
	)
	switch {
	case errors.As(err, &he):
		return he.Code
	case errors.As(err, &pe):
		return pe.status
	case errors.Is(err, ErrNotFound), errors.Is(err, outbox.ErrNotFound), errors.Is(err, payments.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, ErrConflict), errors.Is(err, outbox.ErrConflict), errors.Is(err, payments.ErrNotUnknown),
		errors.Is(err, payments.ErrApprovalPending), errors.Is(err, payments.ErrNotPending), errors.Is(err, payments.ErrDiscrepancyClosed):
		return http.StatusConflict
	case errors.Is(err, payments.ErrSelfApproval):
		return http.StatusForbidden
	case errors.Is(err, outbox.ErrInvalidFilter), errors.Is(err, outbox.ErrInvalidCursor),
		errors.Is(err, payments.ErrInvalidFilter), errors.Is(err, payments.ErrInvalidCursor):
		return http.StatusBadRequest
	case errors.Is(err, outbox.ErrInvalidAction):
		return http.StatusUnprocessableEntity
	case errors.Is(err, ErrForbidden), errors.Is(err, auth.ErrNoRole):
		return http.StatusForbidden
	case errors.Is(err, ErrBadRequest), errors.Is(err, auth.ErrBadState):
		return http.StatusBadRequest
	case errors.Is(err, auth.ErrLoginFailed), errors.Is(err, auth.ErrReauthRequired):
		return http.StatusUnauthorized
	case errors.Is(err, ErrInvalid), errors.Is(err, payments.ErrNoResolution):
		return http.StatusUnprocessableEntity
	case errors.Is(err, context.DeadlineExceeded), db.Unreachable(err):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

var messages = map[int]string{
	http.StatusBadRequest:            "The request was not valid. If you were signing in, start again from the console.",
	http.StatusUnauthorized:          "You are not signed in, or the sign-in could not be verified.",
	http.StatusForbidden:             "You do not have permission to do this.",
	http.StatusNotFound:              "There is nothing here.",
	http.StatusMethodNotAllowed:      "This address does not accept that method.",
	http.StatusConflict:              "Someone else changed this first. Reload and try again.",
	http.StatusRequestEntityTooLarge: "The request is too large.",
	http.StatusUnprocessableEntity:   "Some fields are not valid.",
	http.StatusTooManyRequests:       "Too many requests. Wait a minute, then try again.",
	http.StatusServiceUnavailable:    "The console is busy or its database is not reachable. Try again shortly.",
	http.StatusInternalServerError:   "Something went wrong on our side.",
}

// handleError is the one error path: a status from the taxonomy, a generic
// page with the request id, and the details in the log only.
func (a *App) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	status := statusOf(err)
	rid := requestIDOf(c)
	level := a.log.Info
	if status >= 500 {
		level = a.log.Error
	}
	level("request failed", "request_id", rid, "route", c.Path(), "method", c.Request().Method, "status", status, "err", err)
	msg, ok := messages[status]
	if !ok {
		msg = http.StatusText(status)
	}
	var (
		pe    *publicError
		shown *shownError
		perm  *auth.PermissionError
	)
	switch {
	case errors.As(err, &perm):
		msg = permissionMessage(perm)
	case errors.Is(err, auth.ErrCSRF):
		msg = "This form's security token is missing or belongs to an earlier sign-in, so nothing was done. Reload the page and try again."
	case errors.As(err, &pe):
		msg = pe.msg
	case errors.As(err, &shown):
		msg = shown.msg
	case errors.Is(err, errTooManySignIns):
		msg = errTooManySignIns.Message.(string)
	case errors.Is(err, auth.ErrProviderUnavailable):
		msg = "The identity provider cannot be reached to confirm your roles. Try again shortly."
	}
	if errors.Is(err, auth.ErrReauthRequired) {
		msg = "This action needs a recent sign-in. Sign in again, then repeat it."
		// htmx follows this header with a full navigation.
		c.Response().Header().Set("HX-Redirect", "/login?reauth=1")
	}
	if !strings.Contains(c.Request().Header.Get("Accept"), "text/html") || c.Request().Header.Get("HX-Request") != "" {
		text := http.StatusText(status)
		if status == http.StatusTooManyRequests || perm != nil || errors.Is(err, auth.ErrCSRF) {
			text += ": " + msg // scripts and curl users see why too
		}
		_ = c.String(status, text+" (request id "+rid+")\n")
		return
	}
	var buf bytes.Buffer
	if rerr := views.ErrorPage(status, http.StatusText(status), msg, rid).Render(c.Request().Context(), &buf); rerr != nil {
		_ = c.String(http.StatusInternalServerError, "Internal Server Error (request id "+rid+")\n")
		return
	}
	_ = c.HTMLBlob(status, buf.Bytes())
}

// permissionMessage says what a refused user lacks and which roles have
// it, so they know whom to ask rather than only that they may not.
func permissionMessage(e *auth.PermissionError) string {
	names := func(roles []auth.Role) []string {
		out := make([]string, len(roles))
		for i, r := range roles {
			out[i] = string(r)
		}
		return out
	}
	have := auth.RolesWith(e.Need)
	who := "the role " + views.AndList(names(have)) + " has"
	if len(have) > 1 {
		who = "the roles " + views.AndList(names(have)) + " have"
	}
	yours := "the role " + views.AndList(names(e.Roles))
	switch {
	case len(e.Roles) == 0:
		yours = "no console role"
	case len(e.Roles) > 1:
		yours = "the roles " + views.AndList(names(e.Roles))
	}
	return "This needs the permission to " + e.Need.Describe() + ", which " + who + ". You are signed in with " + yours +
		". Whoever assigns console roles at your identity provider can give you one of them."
}

// crossOriginDenied answers a request refused by http.CrossOriginProtection
// (outside echo): 403, audited when a signed-in browser sent it, else
// counted in the refusal log.
func (a *App) crossOriginDenied(w http.ResponseWriter, r *http.Request) {
	c := a.e.NewContext(r, w)
	_ = requestID(func(echo.Context) error { return nil })(c)
	a.setSecurityHeaders(w.Header())
	// The audit names the route template, never the raw path: the path is
	// attacker data of any length.
	a.e.Router().Find(r.Method, echo.GetPath(r), c)
	route := c.Path()
	if route == "" {
		route = "unmatched"
	}
	if err := a.guard.Refused(c, methodName(r.Method)+" "+route, "cross_origin"); err != nil {
		a.log.Error("record of a cross-origin refusal failed", "err", err)
	}
	a.metrics.actions.WithLabelValues("request", "denied").Inc()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusForbidden)
	_, _ = w.Write([]byte("Forbidden: cross-origin request (request id " + requestIDOf(c) + ")\n"))
}

// methodName bounds the method for the audit trail (any token is a valid
// HTTP method).
func methodName(m string) string {
	switch m {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return m
	}
	return "OTHER"
}

// render writes a templ component through a buffer, so a rendering error
// becomes a clean 500 instead of half a page.
func render(c echo.Context, status int, comp templ.Component) error {
	var buf bytes.Buffer
	if err := comp.Render(c.Request().Context(), &buf); err != nil {
		return err
	}
	return c.HTMLBlob(status, buf.Bytes())
}
