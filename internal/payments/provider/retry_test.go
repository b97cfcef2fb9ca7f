package provider

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
)

// A charge the provider received in full and then crashed on (connection
// closed without an answer, the provider then refusing connections) may
// have moved money: it must come back as ErrOutcomeUnknown, never as
// ErrNotProcessed. Go's transport silently retries a request carrying an
// Idempotency-Key on a fresh connection when a reused one fails, and the
// refused dial of that retry must not hide that the first attempt reached
// the provider.
func TestChargeReceivedThenProviderCrashIsUnknown(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var received atomic.Int32
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if received.Add(1) == 1 {
			// The first charge answers normally, leaving a keep-alive
			// connection for the next one to reuse.
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"operation_id":"` + r.Header.Get("Idempotency-Key") + `","status":"succeeded","provider_ref":"p1"}`))
			return
		}
		_ = body // the whole request arrived: the charge may be done
		_ = ln.Close()
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	c := NewClient("http://"+ln.Addr().String(), 5*time.Second)
	ctx := context.Background()
	if res, err := c.Charge(ctx, req(uuid.New())); err != nil || res.Outcome != Succeeded {
		t.Fatalf("first charge: %+v %v", res, err)
	}
	_, err = c.Charge(ctx, req(uuid.New()))
	if received.Load() != 2 {
		t.Fatalf("the provider received %d charges, want 2", received.Load())
	}
	if errors.Is(err, ErrNotProcessed) || !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("a charge the provider received and crashed on: err = %v, want ErrOutcomeUnknown", err)
	}
}
