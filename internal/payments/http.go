package payments

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/pii"
)

// Handler is the HTTP API: POST /v1/payments, GET /v1/payments/:operation_id,
// GET /healthz (the process runs), GET /readyz (the database answers and its
// schema is current). Every error is JSON {"code","message"} with a stable code.
//
// The /v1 routes answer only requests whose Host is one of allowedHosts
// (see AllowedHosts; a page on another site that rebinds its DNS name to
// this address gets 421) and that carry a merchant's API key
// (Authorization: Bearer …; 401 otherwise). The merchant is the key's,
// never a header's: X-Merchant-ID is ignored. Health routes need neither,
// so probes keep working.
func (s *Service) Handler(allowedHosts []string) http.Handler {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.errorHandler
	e.Use(s.measure)
	api := e.Group("/v1", checkHost(allowedHosts), s.authenticate)
	api.POST("/payments", s.handleCreate)
	api.GET("/payments/:operation_id", s.handleGet)
	e.GET("/healthz", func(c echo.Context) error { return c.String(http.StatusOK, "ok\n") })
	e.GET("/readyz", s.handleReady)
	return e
}

// routeLabels are the route templates the latency histogram may name;
// anything else is "other", so a scanner cannot grow the label set.
var routeLabels = map[string]bool{"/v1/payments": true, "/v1/payments/:operation_id": true, "/healthz": true, "/readyz": true}

// measure observes every request's latency by route template and status
// code. It runs the error handler itself so the final status is known.
func (s *Service) measure(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		if err := next(c); err != nil {
			c.Error(err)
		}
		route := c.Path()
		if !routeLabels[route] {
			route = "other"
		}
		s.m.requests.WithLabelValues(route, strconv.Itoa(c.Response().Status)).Observe(time.Since(start).Seconds())
		return nil
	}
}

// AllowedHosts is the Host allowlist of a service listening on listenAddr
// (the bound address, port included) plus extra names: "name" allows that
// name on any port, "name:port" on that port only. A loopback listener is
// also reachable as localhost; an unspecified one (0.0.0.0, [::]) only
// under the extra names, since no client addresses it by that name.
func AllowedHosts(listenAddr string, extra []string) []string {
	var out []string
	if host, port, err := net.SplitHostPort(listenAddr); err == nil {
		ip := net.ParseIP(host)
		switch {
		case host == "" || (ip != nil && ip.IsUnspecified()):
		case ip != nil && ip.IsLoopback():
			out = append(out, net.JoinHostPort(host, port), net.JoinHostPort("localhost", port))
		default:
			out = append(out, net.JoinHostPort(host, port))
		}
	}
	for _, h := range extra {
		if h = strings.TrimSpace(h); h != "" {
			out = append(out, h)
		}
	}
	return out
}

// checkHost refuses a request whose Host header is not allowed: the
// DNS-rebinding defence (a browser sends the attacker's name as Host).
func checkHost(allowed []string) echo.MiddlewareFunc {
	exact, anyPort := map[string]bool{}, map[string]bool{}
	for _, h := range allowed {
		h = strings.ToLower(h)
		if _, _, err := net.SplitHostPort(h); err == nil {
			exact[h] = true
		} else {
			anyPort[strings.Trim(h, "[]")] = true
		}
	}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			host := strings.ToLower(c.Request().Host)
			ok := exact[host] || anyPort[host]
			if name, _, err := net.SplitHostPort(host); err == nil && anyPort[name] {
				ok = true
			}
			if !ok {
				return writeError(c, http.StatusMisdirectedRequest, CodeMisdirected, "this service does not answer for the host name in the request; use the address it is configured for (PAYMENTS_API_HOSTS)")
			}
			return next(c)
		}
	}
}

// ctxMerchant is where authenticate leaves the caller's merchant id.
const ctxMerchant = "payments.merchant"

// authenticate turns Authorization: Bearer <key> into the caller's
// merchant, or answers 401 with WWW-Authenticate (RFC 6750). The key is
// never logged.
func (s *Service) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		scheme, token, found := strings.Cut(c.Request().Header.Get("Authorization"), " ")
		if !found || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
			c.Response().Header().Set("WWW-Authenticate", `Bearer realm="sluice-payments"`)
			return writeError(c, http.StatusUnauthorized, CodeUnauthorized, "an API key is required: Authorization: Bearer <key>")
		}
		merchant, _, err := Authenticate(c.Request().Context(), s.pool, strings.TrimSpace(token))
		if errors.Is(err, ErrUnauthenticated) {
			c.Response().Header().Set("WWW-Authenticate", `Bearer realm="sluice-payments", error="invalid_token"`)
			return writeError(c, http.StatusUnauthorized, CodeUnauthorized, "the API key is unknown or revoked")
		}
		if err != nil {
			return err
		}
		c.Set(ctxMerchant, merchant)
		return next(c)
	}
}

func writeJSONBody(c echo.Context, status int, body []byte) error {
	h := c.Response().Header()
	h.Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	h.Set("Cache-Control", "no-store")
	c.Response().WriteHeader(status)
	_, err := c.Response().Write(body)
	return err
}

func writeError(c echo.Context, status int, code, message string) error {
	return writeJSONBody(c, status, ErrorBody(code, message))
}

// errorHandler is the one error path: known HTTP errors keep their status
// with a generic code; anything else is a 500 whose details go to the log.
func (s *Service) errorHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		code := "http_" + strconv.Itoa(he.Code)
		switch he.Code {
		case http.StatusNotFound:
			code = CodeNotFound
		case http.StatusMethodNotAllowed:
			code = "method_not_allowed"
		}
		_ = writeError(c, he.Code, code, http.StatusText(he.Code))
		return
	}
	s.log.Error("payments: request failed", "method", c.Request().Method, "path", c.Path(), "err", err)
	_ = writeError(c, http.StatusInternalServerError, CodeInternal, "the service could not answer; retry with the same Idempotency-Key")
}

func (s *Service) handleCreate(c echo.Context) error {
	r := c.Request()
	key := r.Header.Get("Idempotency-Key")
	if strings.TrimSpace(key) == "" {
		return writeError(c, 400, CodeMissingKey, "the Idempotency-Key header is required")
	}
	if len(key) > 255 || strings.ContainsFunc(key, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
		return writeError(c, 400, CodeInvalidKey, "the Idempotency-Key must be 1–255 visible ASCII characters")
	}
	merchant, _ := c.Get(ctxMerchant).(string)
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return writeError(c, 400, CodeBodyTooLarge, "the body is larger than "+strconv.FormatInt(s.cfg.MaxBodyBytes, 10)+" bytes")
		}
		return writeError(c, 400, "unreadable_body", "the body could not be read")
	}
	req, err := ParseRequest(body)
	if err != nil {
		var re *RequestError
		if errors.As(err, &re) {
			return writeError(c, re.Status, re.Code, re.Message)
		}
		return err
	}
	resp, err := s.Create(r.Context(), merchant, key, req)
	if err != nil {
		return err
	}
	if resp.Replayed {
		s.m.replays.Inc()
		c.Response().Header().Set("Idempotent-Replayed", "true")
	}
	if resp.RetryAfter > 0 {
		c.Response().Header().Set("Retry-After", strconv.Itoa(resp.RetryAfter))
	}
	return writeJSONBody(c, resp.Status, resp.Body)
}

// handleGet returns a payment's current state to the merchant that owns it
// (another merchant's payment is 404, like a missing one).
func (s *Service) handleGet(c echo.Context) error {
	merchant, _ := c.Get(ctxMerchant).(string)
	op, err := uuid.Parse(c.Param("operation_id"))
	if err != nil {
		return writeError(c, 400, "invalid_operation_id", "operation_id must be a UUID")
	}
	p, err := Get(c.Request().Context(), s.pool, op)
	if errors.Is(err, ErrNotFound) || (err == nil && p.MerchantID != merchant) {
		return writeError(c, 404, CodeNotFound, "no such payment")
	}
	if err != nil {
		return err
	}
	b := bodyOf(p)
	b.Customer = s.MaskedCustomer(p)
	out, _ := json.Marshal(b)
	return writeJSONBody(c, http.StatusOK, out)
}

// MaskedCustomer decrypts and masks a payment's customer fields; a value
// under a key this service does not hold shows as "undecryptable".
func (s *Service) MaskedCustomer(p Payment) map[string]string {
	out := make(map[string]string, len(p.Customer))
	for field, env := range p.Customer {
		clear, err := s.kr.Decrypt(field, env)
		if err != nil {
			out[field] = pii.Undecryptable
			continue
		}
		out[field] = pii.Show(field, clear)
	}
	return out
}

func (s *Service) handleReady(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
	defer cancel()
	if err := db.Ready(ctx, s.pool); err != nil {
		s.log.Warn("payments: not ready", "err", err)
		return writeError(c, http.StatusServiceUnavailable, "not_ready", "the database is unreachable or its schema is out of date")
	}
	return c.String(http.StatusOK, "ready\n")
}
