package provider

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
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
	// dial opens the connections (a net.Dialer's; tests wrap it).
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// DefaultTimeout is how long one provider call may take when NewClient is
// given none (PROVIDER_TIMEOUT's default).
const DefaultTimeout = 5 * time.Second

// NewClient returns a client for the provider at baseURL; each call gives
// up after timeout.
func NewClient(baseURL string, timeout time.Duration) *Client {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	// A charge written to a kept-alive connection the provider is closing
	// at that moment may have left before the connection died, so its
	// outcome is unknown (it is never re-sent: see doCharge). Closing idle
	// connections before common servers' keep-alive limits (5 s for Node.js
	// and Apache, 60–75 s for load balancers and nginx) makes that race
	// rare; Go's default keeps them 90 s. A charge that found the
	// connection already dead wrote nothing, and is sent again (Charge).
	tr.IdleConnTimeout = 4 * time.Second
	// Connections count what they write, so that a failed charge can say
	// whether any of it left this process (send).
	c := &Client{base: strings.TrimRight(baseURL, "/"), timeout: timeout,
		dial: (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext}
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := c.dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: conn}, nil
	}
	// A redirect is answered, never followed: followed, a charge's POST
	// answered 303 became a GET elsewhere whose 200 would be read as the
	// charge's outcome. Unfollowed, it is an answer that is not the
	// provider's protocol: the outcome is unknown.
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	c.hc = &http.Client{Transport: tr, CheckRedirect: noRedirect}
	return c
}

type wireCharge struct {
	OperationID string `json:"operation_id"`
	Amount      string `json:"amount,omitempty"`
	Currency    string `json:"currency,omitempty"`
	Status      string `json:"status,omitempty"`
	ProviderRef string `json:"provider_ref,omitempty"`
	DeclineCode string `json:"decline_code,omitempty"`
}

// countingConn counts the bytes written to a connection.
type countingConn struct {
	net.Conn
	written atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

// counted is the countingConn under conn (nil when conn is not one: the
// caller cannot tell what was written).
func counted(conn net.Conn) *countingConn {
	if t, ok := conn.(*tls.Conn); ok {
		conn = t.NetConn()
	}
	cc, _ := conn.(*countingConn)
	return cc
}

// errNothingWritten: the charge failed before any byte of it was written
// to the connection it held (a kept-alive connection the provider had
// closed), so the provider cannot have received it.
var errNothingWritten = errors.New("nothing of the request was written")

// Charge implements Provider.
func (c *Client) Charge(ctx context.Context, req ChargeRequest) (Result, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	res, err := c.charge(ctx, req)
	if errors.Is(err, errNothingWritten) && ctx.Err() == nil {
		// It never left: sending it again is the first send. Once, on a
		// fresh connection (the dead one is out of the pool): a second
		// failure is reported as it is.
		res, err = c.charge(ctx, req)
	}
	return res, err
}

func (c *Client) charge(ctx context.Context, req ChargeRequest) (Result, error) {
	body, _ := json.Marshal(wireCharge{OperationID: req.OperationID.String(), Amount: req.Amount.StringFixed(2), Currency: req.Currency})
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/charges", bytes.NewReader(body))
	if err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrNotProcessed, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Idempotency-Key", req.OperationID.String())
	// A charge is sent at most once per call: this client, not net/http,
	// decides every retry. net/http's Transport replays a request on a new
	// connection when a reused keep-alive connection dies before answering,
	// if the request is "replayable" (Request.isReplayable: a GET, or any
	// method carrying an Idempotency-Key header) and its body can be rewound
	// (rewindBody needs GetBody). That replay happens even when the first
	// copy was written and the provider charged; the answer we read is then
	// the replay's (say a 503), which would hide the charge. Without GetBody
	// a request with a body is never replayable (isReplayable checks it
	// before the header) and never rewound, whatever headers it carries or
	// however the transport classifies the error; NewRequest sets GetBody
	// for a bytes.Reader, so we take it away. ContentLength stays set.
	hreq.GetBody = nil
	res, err := c.doCharge(hreq)
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

// doCharge sends a charge and classifies what came back. Whether the
// provider may have processed it decides between ErrNotProcessed and
// ErrOutcomeUnknown: once any attempt held a connection, bytes of the
// request may have reached the provider, so only a definite 503 answer to
// the one attempt that was sent still means "not processed".
func (c *Client) doCharge(hreq *http.Request) (Result, error) {
	return c.send(hreq, true)
}

// Inquire's GET is read-only: net/http may replay it freely.
func (c *Client) do(hreq *http.Request) (Result, error) {
	return c.send(hreq, false)
}

func (c *Client) send(hreq *http.Request, charge bool) (Result, error) {
	// How many attempts got a connection, so bytes of the request may have
	// reached the provider. A charge is not replayable (see Charge), so this
	// is at most one; counting keeps the rule right should the transport
	// ever send it twice: a refused dial or a 503 of a second attempt says
	// nothing about the first.
	var conns atomic.Int32
	// What each held connection had written when the request got it: a
	// request whose connections all wrote nothing since never left.
	var (
		mu    sync.Mutex
		held  []*countingConn
		start []int64
		blind bool // a connection that does not count: assume it wrote
	)
	hreq = hreq.WithContext(httptrace.WithClientTrace(hreq.Context(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			conns.Add(1)
			mu.Lock()
			defer mu.Unlock()
			cc := counted(info.Conn)
			if cc == nil {
				blind = true
				return
			}
			held, start = append(held, cc), append(start, cc.written.Load())
		},
	}))
	nothingWritten := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if blind || len(held) == 0 {
			return false
		}
		for i, cc := range held {
			if cc.written.Load() != start[i] {
				return false
			}
		}
		return true
	}
	resp, err := c.hc.Do(hreq)
	if err != nil {
		// A failed dial (refused, reset while connecting) with no attempt
		// ever holding a connection means the request never left this
		// process: nothing can have been processed.
		var opErr *net.OpError
		if conns.Load() == 0 && (errors.Is(err, syscall.ECONNREFUSED) || (errors.As(err, &opErr) && opErr.Op == "dial")) {
			return Result{}, fmt.Errorf("%w: %v", ErrNotProcessed, err)
		}
		// Neither did a request that held connections and wrote nothing on
		// them: net/http reports a kept-alive connection the provider had
		// closed ("server closed idle connection") the same way whether or
		// not the request went out on it, and only the first is unknown.
		if nothingWritten() {
			return Result{}, fmt.Errorf("%w: %w: %v", ErrNotProcessed, errNothingWritten, err)
		}
		return Result{}, fmt.Errorf("%w: %v", ErrOutcomeUnknown, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return Result{}, fmt.Errorf("%w: read answer: %v", ErrOutcomeUnknown, err)
	}
	if resp.StatusCode == http.StatusServiceUnavailable {
		if charge && conns.Load() != 1 {
			return Result{}, fmt.Errorf("%w: provider unavailable (503) after %d attempts; an earlier one may have charged", ErrOutcomeUnknown, conns.Load())
		}
		// Only the provider's own 503 says it processed nothing. A 503 from
		// anything between (a sidecar, an egress proxy, the provider's
		// load balancer: "upstream reset before headers") may come after
		// the charge was forwarded and made; read as "not processed", the
		// payment failed, its invoice was free for a new key, and the
		// customer could be charged twice.
		if charge && !unavailableAnswer(data) {
			return Result{}, fmt.Errorf("%w: 503 that is not the provider's own answer (a proxy's?): the charge may have been forwarded", ErrOutcomeUnknown)
		}
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

// unavailableAnswer reports whether a 503's body is the provider
// protocol's own "not processed" answer, exactly {"error":"unavailable"}
// (whitespace aside): encoding/json would also take {"ERROR":…} or a
// repeated "error", which the provider never writes.
func unavailableAnswer(body []byte) bool {
	var b bytes.Buffer
	return json.Compact(&b, body) == nil && b.String() == `{"error":"unavailable"}`
}
