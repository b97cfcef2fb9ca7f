package provider

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
)

// The bug of issue 7: a charge goes out on a reused keep-alive connection,
// the provider charges, then the connection dies without an answer. Go's
// transport used to replay the request (it carries an Idempotency-Key) on a
// new connection, read that replay's 503 and report ErrNotProcessed: the
// payment became failed although the money had moved. The charge must be
// sent once and come back as ErrOutcomeUnknown.
func TestChargeOnDeadKeepAliveIsNotReplayed(t *testing.T) {
	t.Parallel()
	var charges, inquiries atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet:
			// An inquiry, answered normally: it leaves an idle keep-alive
			// connection for the charge to reuse.
			inquiries.Add(1)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"operation_id":"` + r.PathValue("id") + `","status":"not_found"}`))
		case charges.Add(1) == 1:
			// The first charge: read in full (the provider charges), then
			// the connection is closed without a byte of answer.
			_, _ = io.ReadAll(r.Body)
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				_ = conn.Close()
			}
		default:
			// Any repeat finds the provider "down": the 503 that used to
			// turn the charged payment into failed.
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":"unavailable"}`))
		}
	}))
	t.Cleanup(srv.Close)

	c := NewClient(srv.URL, 5*time.Second)
	op := uuid.New()
	if res, err := c.Inquire(context.Background(), op); err != nil || res.Outcome != NotFound {
		t.Fatalf("priming inquiry: %+v %v", res, err)
	}
	// Whether the charge's first attempt went out on the primed connection.
	var attempts atomic.Int32
	var reused atomic.Bool
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		if attempts.Add(1) == 1 {
			reused.Store(i.Reused)
		}
	}})
	_, err := c.Charge(ctx, req(op))
	if !reused.Load() {
		t.Fatal("the charge did not reuse the keep-alive connection: the test does not exercise the replay")
	}
	if n := charges.Load(); n != 1 {
		t.Fatalf("the provider received %d charge requests, want exactly 1 (the transport replayed the charge)", n)
	}
	if errors.Is(err, ErrNotProcessed) || !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("a charge the provider received and never answered: err = %v, want ErrOutcomeUnknown", err)
	}
}

// A definite 503 to the one attempt that was sent is still "not processed":
// the fix must not turn every provider outage into unknown.
func TestCharge503OnSingleAttemptIsNotProcessed(t *testing.T) {
	t.Parallel()
	var charges atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	c := NewClient(srv.URL, 5*time.Second)
	for i := range 2 { // a fresh connection, then a reused one
		if _, err := c.Charge(context.Background(), req(uuid.New())); !errors.Is(err, ErrNotProcessed) {
			t.Fatalf("charge %d: err = %v, want ErrNotProcessed", i, err)
		}
	}
	if charges.Load() != 2 {
		t.Fatalf("charges = %d, want 2", charges.Load())
	}
}
