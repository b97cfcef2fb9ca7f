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
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":"unavailable"}`))
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

// Only the provider's own 503 means nothing was processed. A 503 from
// something between (a sidecar or load balancer answering "upstream reset
// before headers" after it forwarded the charge) may follow a charge that
// was made: read as "not processed", the payment failed and its invoice
// could be paid again, charging the customer twice. A redirect is not
// followed (a 303 would turn the POST into a GET elsewhere whose answer was
// read as the charge's): it is not the provider's answer either.
func TestChargeAnswersNotFromTheProviderAreUnknown(t *testing.T) {
	t.Parallel()
	var elsewhere atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("case") {
		case "proxy503":
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("upstream connect error or disconnect/reset before headers. reset reason: connection termination"))
		case "html503":
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("<html><body>503 Service Temporarily Unavailable</body></html>"))
		case "shouted503":
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"ERROR":"unavailable"}`))
		case "redirect":
			http.Redirect(w, r, "/elsewhere", http.StatusSeeOther)
		default:
			elsewhere.Add(1)
			_, _ = w.Write([]byte(`{"operation_id":"00000000-0000-0000-0000-000000000000","status":"succeeded"}`))
		}
	}))
	t.Cleanup(srv.Close)
	for _, c := range []string{"proxy503", "html503", "shouted503", "redirect"} {
		cl := NewClient(srv.URL+"/?case="+c+"&x=", 5*time.Second)
		_, err := cl.Charge(context.Background(), req(uuid.New()))
		if errors.Is(err, ErrNotProcessed) || !errors.Is(err, ErrOutcomeUnknown) {
			t.Errorf("%s: err = %v, want ErrOutcomeUnknown", c, err)
		}
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the redirect was followed %d time(s)", n)
	}
}
