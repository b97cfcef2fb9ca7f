package web

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/a-h/templ"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/db"
)

const requestIDKey = "sluice.request_id"

// requestID gives every request a fresh id (error pages, logs and audit
// rows quote it). An incoming X-Request-Id is not trusted.
func requestID(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		id := hex.EncodeToString(b)
		c.Set(requestIDKey, id)
		c.Response().Header().Set(echo.HeaderXRequestID, id)
		return next(c)
	}
}

func requestIDOf(c echo.Context) string {
	id, _ := c.Get(requestIDKey).(string)
	return id
}

// securityHeaders sets the CSP with a per-request nonce (templ puts it on
// the page's scripts) and the other headers of SECURITY.md.
func (a *App) securityHeaders(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		nonce := a.setSecurityHeaders(c.Response().Header())
		req := c.Request()
		c.SetRequest(req.WithContext(templ.WithNonce(req.Context(), nonce)))
		if strings.HasPrefix(req.URL.Path, "/static/") {
			c.Response().Header().Del("Cache-Control") // the static handler sets its own
		}
		return next(c)
	}
}

// setSecurityHeaders writes the headers every response carries (pages,
// errors, 404s and the cross-origin refusal, which is answered outside
// echo) and returns the fresh CSP nonce.
func (a *App) setSecurityHeaders(h http.Header) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	nonce := base64.StdEncoding.EncodeToString(b)
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'nonce-"+nonce+"'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; connect-src 'self'; form-action 'self' "+a.formActionExtra())
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cache-Control", "no-store")
	if a.cookies.Secure {
		// An https console is only ever reached over https.
		h.Set("Strict-Transport-Security", "max-age=31536000")
	}
	return nonce
}

// formActionExtra allows the logout form's redirect chain to reach the
// provider (form-action applies to redirects after a form submission).
func (a *App) formActionExtra() string {
	return a.cfg.OIDCIssuer
}

type metrics struct {
	requests *prometheus.HistogramVec
	actions  *prometheus.CounterVec
	refusals *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_http_request_duration_seconds",
			Help:    "Console HTTP requests by route template, method and status.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"route", "method", "code"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_console_actions_total",
			Help: "Console actions (logins, logouts, refusals, operator actions) by outcome.",
		}, []string{"action", "outcome"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_console_refusals_total",
			Help: "Requests refused without a session (cross-site, anonymous POSTs), by reason; rate-limited into the refusal log, all counted here.",
		}, []string{"reason"}),
	}
	var err error
	if m.requests, err = db.Register(reg, m.requests); err != nil {
		return nil, err
	}
	if m.actions, err = db.Register(reg, m.actions); err != nil {
		return nil, err
	}
	if m.refusals, err = db.Register(reg, m.refusals); err != nil {
		return nil, err
	}
	return m, nil
}

// middleware labels requests by route template and a method from a fixed
// set (both bounded), never by raw path or method.
func (m *metrics) middleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		route := c.Path()
		if route == "" {
			route = "unmatched"
		}
		// An error not yet answered is answered by handleError with
		// statusOf's status: count that one (a 503 of an outage, a 400 or
		// a 429 counted as 500 looked like a bug to an error-rate alert).
		status := c.Response().Status
		if err != nil && !c.Response().Committed {
			status = statusOf(err)
		}
		if c.Request().Header.Get("Upgrade") == "" {
			m.requests.WithLabelValues(route, methodLabel(c.Request().Method), strconv.Itoa(status)).Observe(time.Since(start).Seconds())
		}
		return err
	}
}
