// Package paymentsapi is the HTTP transport of the payments service: the
// echo routes of POST /v1/payments and GET /v1/payments/{operation_id}, the
// Host allowlist, API-key authentication, request parsing into
// payments.Request, the one error path and the request metrics. The
// domain (package payments) knows nothing of HTTP; dependencies flow from
// here to there only.
package paymentsapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/telemetry"
)

// Payments is what the API needs from the payments service
// (*payments.Service provides it).
type Payments interface {
	// Create runs one payment request for (merchant, Idempotency-Key).
	Create(ctx context.Context, merchantID, key string, req payments.Request) (payments.Response, error)
	// PaymentOf is the merchant's view of its payment (payments.ErrNotFound
	// for a missing one and for another merchant's).
	PaymentOf(ctx context.Context, merchantID string, op uuid.UUID) (payments.PaymentBody, error)
	// Authenticate returns an API key's merchant (payments.ErrUnauthenticated).
	Authenticate(ctx context.Context, apiKey string) (merchantID string, err error)
	// Ready reports whether the database answers with a current schema.
	Ready(ctx context.Context) error
}

// Config tunes the API. Zero values take the defaults.
type Config struct {
	AllowedHosts []string // the Host allowlist (see AllowedHosts); empty refuses every /v1 request
	MaxBodyBytes int64    // request body limit (16 KiB)
	Logger       *slog.Logger
	Registerer   prometheus.Registerer // receives the request metrics (nil: none)
	// Tracing (nil: none) makes a server span per request, child of the
	// request's traceparent. Without it a request's traceparent still
	// reaches the outbox events the request writes.
	Tracing trace.TracerProvider
}

type api struct {
	svc          Payments
	log          *slog.Logger
	maxBodyBytes int64
	requests     *prometheus.HistogramVec
	tracer       trace.Tracer // nil: no spans
}

// NewServer is the HTTP server for the API's handler h: a client gets 5 s
// to send its headers and 30 s for its whole request, so a body trickled
// in byte by byte cannot hold a connection and its goroutine for ever.
func NewServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second}
}

// New is the HTTP API: POST /v1/payments, GET /v1/payments/:operation_id,
// GET /healthz (the process runs), GET /readyz (the database answers and its
// schema is current). Every error is JSON {"code","message"} with a stable code.
//
// The /v1 routes answer only requests whose Host is one of cfg.AllowedHosts
// (a page on another site that rebinds its DNS name to this address gets
// 421) and that carry a merchant's API key (Authorization: Bearer …; 401
// otherwise). The merchant is the key's, never a header's: X-Merchant-ID is
// ignored. Health routes need neither, so probes keep working.
func New(svc Payments, cfg Config) (http.Handler, error) {
	if svc == nil {
		return nil, errors.New("paymentsapi: a payments service is required")
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 16 << 10
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	requests, err := db.Register(cfg.Registerer, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sluice_payments_http_request_duration_seconds",
		Help:    "Payments API request latency, by route template and status code.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"route", "code"}))
	if err != nil {
		return nil, fmt.Errorf("paymentsapi: metrics: %w", err)
	}
	a := &api{svc: svc, log: cfg.Logger, maxBodyBytes: cfg.MaxBodyBytes, requests: requests}
	if cfg.Tracing != nil {
		a.tracer = telemetry.Tracer(cfg.Tracing)
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = a.errorHandler
	e.Use(a.traced, a.measure)
	v1 := e.Group("/v1", checkHost(cfg.AllowedHosts), a.authenticate)
	// Any other method on the API's paths is a 405 naming the one there is
	// (the group's catch-all answered 404 not_found, which reads as a wrong
	// path); registered first, so the routes below take their own method.
	v1.Any("/payments", methodNotAllowed(http.MethodPost))
	v1.Any("/payments/:operation_id", methodNotAllowed(http.MethodGet))
	v1.POST("/payments", a.handleCreate)
	v1.GET("/payments/:operation_id", a.handleGet)
	e.GET("/healthz", func(c echo.Context) error { return c.String(http.StatusOK, "ok\n") })
	e.GET("/readyz", a.handleReady)
	return e, nil
}

// methodNotAllowed answers a method the path does not take: 405, with
// the one it does in Allow.
func methodNotAllowed(allow string) echo.HandlerFunc {
	return func(c echo.Context) error {
		c.Response().Header().Set("Allow", allow)
		return writeError(c, http.StatusMethodNotAllowed, "method_not_allowed", "this path takes "+allow+" only")
	}
}

// routeLabels are the route templates the latency histogram may name;
// anything else is "other", so a scanner cannot grow the label set.
var routeLabels = map[string]bool{"/v1/payments": true, "/v1/payments/:operation_id": true, "/healthz": true, "/readyz": true}

// measure observes every request's latency by route template and status
// code. It runs the error handler itself so the final status is known.
func (a *api) measure(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		if err := next(c); err != nil {
			c.Error(err)
		}
		route := c.Path()
		if !routeLabels[route] {
			route = "other"
		}
		a.requests.WithLabelValues(route, strconv.Itoa(c.Response().Status)).Observe(time.Since(start).Seconds())
		return nil
	}
}

// traced continues the caller's W3C trace context (traceparent): the
// request's context carries it, so the outbox events the request writes
// store it (outbox.Insert), and with tracing on a server span wraps the
// request, named by its route template.
func (a *api) traced(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		req := c.Request()
		ctx := telemetry.ExtractHTTP(req.Context(), propagation.HeaderCarrier(req.Header))
		if a.tracer == nil {
			c.SetRequest(req.WithContext(ctx))
			return next(c)
		}
		ctx, span := a.tracer.Start(ctx, req.Method, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", req.Method)))
		defer span.End()
		c.SetRequest(req.WithContext(ctx))
		err := next(c)
		route := c.Path()
		if !routeLabels[route] {
			route = "other"
		}
		span.SetName(req.Method + " " + route)
		span.SetAttributes(attribute.String("http.route", route), attribute.Int("http.response.status_code", c.Response().Status))
		if c.Response().Status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(c.Response().Status))
		}
		return err
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
				return writeError(c, http.StatusMisdirectedRequest, payments.CodeMisdirected, "this service does not answer for the host name in the request; use the address it is configured for (PAYMENTS_API_HOSTS)")
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
func (a *api) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		scheme, token, found := strings.Cut(c.Request().Header.Get("Authorization"), " ")
		if !found || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
			c.Response().Header().Set("WWW-Authenticate", `Bearer realm="sluice-payments"`)
			return writeError(c, http.StatusUnauthorized, payments.CodeUnauthorized, "an API key is required: Authorization: Bearer <key>")
		}
		merchant, err := a.svc.Authenticate(c.Request().Context(), strings.TrimSpace(token))
		if errors.Is(err, payments.ErrUnauthenticated) {
			c.Response().Header().Set("WWW-Authenticate", `Bearer realm="sluice-payments", error="invalid_token"`)
			return writeError(c, http.StatusUnauthorized, payments.CodeUnauthorized, "the API key is unknown or revoked")
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
	return writeJSONBody(c, status, payments.ErrorBody(code, message))
}

// errorHandler is the one error path: known HTTP errors keep their status
// with a generic code; anything else is a 500 whose details go to the log.
func (a *api) errorHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		code := "http_" + strconv.Itoa(he.Code)
		switch he.Code {
		case http.StatusNotFound:
			code = payments.CodeNotFound
		case http.StatusMethodNotAllowed:
			code = "method_not_allowed"
		}
		_ = writeError(c, he.Code, code, http.StatusText(he.Code))
		return
	}
	a.log.Error("payments: request failed", "method", c.Request().Method, "path", c.Path(), "err", err)
	_ = writeError(c, http.StatusInternalServerError, payments.CodeInternal, "the service could not answer; retry with the same Idempotency-Key")
}

func (a *api) handleCreate(c echo.Context) error {
	r := c.Request()
	// One key, once: two header lines (which a proxy may fold into one, or
	// read the last of) would give the service and whatever sits in front
	// of it two different keys for one request.
	if len(r.Header.Values("Idempotency-Key")) > 1 {
		return writeError(c, 400, payments.CodeInvalidKey, "send one Idempotency-Key header")
	}
	key := r.Header.Get("Idempotency-Key")
	if strings.TrimSpace(key) == "" {
		return writeError(c, 400, payments.CodeMissingKey, "the Idempotency-Key header is required")
	}
	if len(key) > 255 || strings.ContainsFunc(key, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
		return writeError(c, 400, payments.CodeInvalidKey, "the Idempotency-Key must be 1–255 visible ASCII characters")
	}
	merchant, _ := c.Get(ctxMerchant).(string)
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, a.maxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return writeError(c, 400, payments.CodeBodyTooLarge, "the body is larger than "+strconv.FormatInt(a.maxBodyBytes, 10)+" bytes")
		}
		return writeError(c, 400, "unreadable_body", "the body could not be read")
	}
	req, err := ParseRequest(body)
	if err != nil {
		var re *RequestError
		if errors.As(err, &re) {
			return writeError(c, re.Status, re.Code, re.Message)
		}
		return fmt.Errorf("paymentsapi: parse request: %w", err)
	}
	resp, err := a.svc.Create(r.Context(), merchant, key, req)
	if err != nil {
		return fmt.Errorf("paymentsapi: create: %w", err)
	}
	if resp.Replayed {
		c.Response().Header().Set("Idempotent-Replayed", "true")
	}
	if resp.RetryAfter > 0 {
		c.Response().Header().Set("Retry-After", strconv.Itoa(resp.RetryAfter))
	}
	if resp.Status == http.StatusCreated || resp.Status == http.StatusAccepted {
		// Where the payment is read (a 202's outcome is found there later);
		// taken from the stored body, so a replay names it too.
		var p struct {
			OperationID uuid.UUID `json:"operation_id"`
		}
		if json.Unmarshal(resp.Body, &p) == nil && p.OperationID != uuid.Nil {
			c.Response().Header().Set("Location", "/v1/payments/"+p.OperationID.String())
		}
	}
	return writeJSONBody(c, resp.Status, resp.Body)
}

// handleGet returns a payment's current state to the merchant that owns it
// (another merchant's payment is 404, like a missing one).
func (a *api) handleGet(c echo.Context) error {
	merchant, _ := c.Get(ctxMerchant).(string)
	op, err := uuid.Parse(c.Param("operation_id"))
	if err != nil {
		return writeError(c, 400, "invalid_operation_id", "operation_id must be a UUID")
	}
	b, err := a.svc.PaymentOf(c.Request().Context(), merchant, op)
	if errors.Is(err, payments.ErrNotFound) {
		return writeError(c, 404, payments.CodeNotFound, "no such payment")
	}
	if err != nil {
		return fmt.Errorf("paymentsapi: read payment %s: %w", op, err)
	}
	out, err := json.Marshal(b)
	if err != nil {
		return fmt.Errorf("paymentsapi: encode payment %s: %w", op, err)
	}
	return writeJSONBody(c, http.StatusOK, out)
}

func (a *api) handleReady(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
	defer cancel()
	if err := a.svc.Ready(ctx); err != nil {
		a.log.Warn("payments: not ready", "err", err)
		return writeError(c, http.StatusServiceUnavailable, "not_ready", "the database is unreachable or its schema is out of date")
	}
	return c.String(http.StatusOK, "ready\n")
}
