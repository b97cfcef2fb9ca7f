package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
)

// Client is the HTTP Provider. Its timeout is a real network timeout: a
// provider that holds the answer longer gives ErrOutcomeUnknown.
type Client struct {
	base    string
	hc      *http.Client
	timeout time.Duration
}

// NewClient returns a client for the provider at baseURL; each call gives
// up after timeout.
func NewClient(baseURL string, timeout time.Duration) *Client {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	return &Client{base: strings.TrimRight(baseURL, "/"), hc: &http.Client{Transport: tr}, timeout: timeout}
}

type wireCharge struct {
	OperationID string `json:"operation_id"`
	Amount      string `json:"amount,omitempty"`
	Currency    string `json:"currency,omitempty"`
	Status      string `json:"status,omitempty"`
	ProviderRef string `json:"provider_ref,omitempty"`
	DeclineCode string `json:"decline_code,omitempty"`
}

// Charge implements Provider.
func (c *Client) Charge(ctx context.Context, req ChargeRequest) (Result, error) {
	body, _ := json.Marshal(wireCharge{OperationID: req.OperationID.String(), Amount: req.Amount.StringFixed(2), Currency: req.Currency})
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/charges", bytes.NewReader(body))
	if err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrNotProcessed, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Idempotency-Key", req.OperationID.String())
	res, err := c.do(hreq)
	if err != nil {
		return Result{}, err
	}
	if !res.Outcome.Definite() {
		return Result{}, fmt.Errorf("%w: charge answered %q", ErrOutcomeUnknown, res.Outcome)
	}
	return res, nil
}

// Inquire implements Provider.
func (c *Client) Inquire(ctx context.Context, operationID uuid.UUID) (Result, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/charges/"+operationID.String(), nil)
	if err != nil {
		return Result{}, err
	}
	return c.do(hreq)
}

func (c *Client) do(hreq *http.Request) (Result, error) {
	// Whether any attempt got a connection, so bytes of the request may have
	// reached the provider. Go's transport retries a request carrying an
	// Idempotency-Key on a new connection when a reused one fails, even after
	// the request was sent; the error it returns is then the retry's, and a
	// refused dial of the retry says nothing about the first attempt.
	var gotConn atomic.Bool
	hreq = hreq.WithContext(httptrace.WithClientTrace(hreq.Context(), &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { gotConn.Store(true) },
	}))
	resp, err := c.hc.Do(hreq)
	if err != nil {
		// A failed dial (refused, reset while connecting) with no attempt
		// ever holding a connection means the request never left this
		// process: nothing can have been processed.
		var opErr *net.OpError
		if !gotConn.Load() && (errors.Is(err, syscall.ECONNREFUSED) || (errors.As(err, &opErr) && opErr.Op == "dial")) {
			return Result{}, fmt.Errorf("%w: %v", ErrNotProcessed, err)
		}
		return Result{}, fmt.Errorf("%w: %v", ErrOutcomeUnknown, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return Result{}, fmt.Errorf("%w: read answer: %v", ErrOutcomeUnknown, err)
	}
	if resp.StatusCode == http.StatusServiceUnavailable {
		return Result{}, fmt.Errorf("%w: provider unavailable (503)", ErrNotProcessed)
	}
	if resp.StatusCode != http.StatusOK {
		return Result{}, fmt.Errorf("%w: provider answered %d", ErrOutcomeUnknown, resp.StatusCode)
	}
	var w wireCharge
	if err := json.Unmarshal(data, &w); err != nil {
		return Result{}, fmt.Errorf("%w: undecodable answer", ErrOutcomeUnknown)
	}
	id, _ := uuid.Parse(w.OperationID)
	out := Outcome(w.Status)
	switch out {
	case Succeeded, Declined, NotFound, Unknown:
	default:
		return Result{}, fmt.Errorf("%w: status %q", ErrOutcomeUnknown, w.Status)
	}
	return Result{OperationID: id, Outcome: out, ProviderRef: w.ProviderRef, DeclineCode: w.DeclineCode}, nil
}
