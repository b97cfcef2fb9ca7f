package payments

import (
	"context"
	"encoding/json"
	"errors"
	"io"
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
func (s *Service) Handler() http.Handler {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.errorHandler
	e.POST("/v1/payments", s.handleCreate)
	e.GET("/v1/payments/:operation_id", s.handleGet)
	e.GET("/healthz", func(c echo.Context) error { return c.String(http.StatusOK, "ok\n") })
	e.GET("/readyz", s.handleReady)
	return e
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
	merchant := r.Header.Get("X-Merchant-ID")
	if strings.TrimSpace(merchant) == "" {
		return writeError(c, 400, CodeMissingMerchant, "the X-Merchant-ID header is required")
	}
	if len(merchant) > 64 || strings.ContainsFunc(merchant, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
		return writeError(c, 400, "invalid_merchant_id", "the X-Merchant-ID must be 1–64 visible ASCII characters")
	}
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
	merchant := c.Request().Header.Get("X-Merchant-ID")
	if strings.TrimSpace(merchant) == "" {
		return writeError(c, 400, CodeMissingMerchant, "the X-Merchant-ID header is required")
	}
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
