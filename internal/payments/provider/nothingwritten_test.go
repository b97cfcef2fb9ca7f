package provider

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/testkit"
)

// failingWriteConn is a connection whose first write fails: with nothing
// written, as a kept-alive connection the provider has closed refuses it,
// or after the whole request was written, as one that dies just after.
type failingWriteConn struct {
	net.Conn
	writeFirst bool
	once       sync.Once
}

func (c *failingWriteConn) Write(p []byte) (n int, err error) {
	failed := false
	c.once.Do(func() {
		failed = true
		if c.writeFirst {
			n, _ = c.Conn.Write(p)
		}
		_ = c.Conn.Close()
	})
	if failed {
		return n, &net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE}
	}
	return c.Conn.Write(p)
}

// chargeServer answers every charge "succeeded" and counts them.
func chargeServer(t *testing.T) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var charges atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		charges.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"operation_id":"` + r.Header.Get("Idempotency-Key") + `","status":"succeeded","provider_ref":"p1"}`))
	}))
	t.Cleanup(srv.Close)
	return srv, &charges
}

// clientWithFailingFirstConn is a client whose first connection's first
// write fails; dials counts its connections.
func clientWithFailingFirstConn(url string, writeFirst bool) (*Client, *atomic.Int32) {
	c := NewClient(url, 5*time.Second)
	var dials atomic.Int32
	dial := c.dial
	c.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil || dials.Add(1) > 1 {
			return conn, err
		}
		return &failingWriteConn{Conn: conn, writeFirst: writeFirst}, nil
	}
	return c, &dials
}

// A charge that failed before a byte of it was written cannot have reached
// the provider: it is sent again, on a new connection, and its answer is
// the payment's. net/http reports such a failure ("server closed idle
// connection", a broken pipe) as it reports one after the request left,
// and the client used to call both "outcome unknown": a payment the
// provider never saw then waited for an operator, its funds held.
func TestAChargeThatWroteNothingIsSentAgain(t *testing.T) {
	t.Parallel()
	srv, charges := chargeServer(t)
	c, dials := clientWithFailingFirstConn(srv.URL, false)
	res, err := c.Charge(context.Background(), req(uuid.New()))
	if err != nil || res.Outcome != Succeeded {
		t.Fatalf("charge: %+v %v; want it sent again and succeeded", res, err)
	}
	if n, d := charges.Load(), dials.Load(); n != 1 || d != 2 {
		t.Fatalf("the provider received %d charges over %d connections, want 1 over 2", n, d)
	}
}

// A charge whose connection failed after it was written may have been
// processed: it stays unknown and is never sent again. (When the provider's
// answer came back before the connection closed, which a loaded machine
// lets happen, net/http returns that answer, and the outcome is known.)
func TestAChargeThatWasWrittenIsNotSentAgain(t *testing.T) {
	t.Parallel()
	srv, charges := chargeServer(t)
	c, dials := clientWithFailingFirstConn(srv.URL, true)
	res, err := c.Charge(context.Background(), req(uuid.New()))
	answered := err == nil && res.Outcome == Succeeded
	if errors.Is(err, ErrNotProcessed) || !answered && !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("a charge written before its connection failed: %+v, err = %v, want ErrOutcomeUnknown (or the provider's answer)", res, err)
	}
	testkit.Until(t, "the provider to receive the written charge", func() bool { return charges.Load() == 1 })
	if d := dials.Load(); d != 1 {
		t.Fatalf("%d connections: the written charge was sent again", d)
	}
}
