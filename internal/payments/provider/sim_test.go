package provider

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"
)

func startSim(t *testing.T, cfg SimConfig) *Simulator {
	t.Helper()
	s := NewSimulator(cfg)
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func req(op uuid.UUID) ChargeRequest {
	return ChargeRequest{OperationID: op, Amount: decimal.RequireFromString("10.50"), Currency: "TRY"}
}

// Parallel charges with one operation id move money once.
func TestChargeIsIdempotentByOperationID(t *testing.T) {
	t.Parallel()
	s := startSim(t, SimConfig{})
	c := NewClient(s.URL(), 5*time.Second)
	op := uuid.New()
	var wg sync.WaitGroup
	refs := make([]string, 20)
	for i := range refs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Charge(context.Background(), req(op))
			if err != nil {
				t.Errorf("charge: %v", err)
				return
			}
			refs[i] = res.ProviderRef
		}()
	}
	wg.Wait()
	if s.MoneyMoved() != 1 {
		t.Fatalf("money moved %d times, want 1", s.MoneyMoved())
	}
	for _, r := range refs {
		if r != refs[0] || r == "" {
			t.Fatalf("answers differ: %v", refs)
		}
	}
	ch, _ := s.Charge(op)
	if ch.Calls != 20 {
		t.Fatalf("calls = %d, want 20", ch.Calls)
	}
}

func TestBehaviours(t *testing.T) {
	t.Parallel()
	s := startSim(t, SimConfig{SlowDelay: time.Second})
	// c waits for definite answers; impatient gives up long before the
	// simulator's held or slow answers arrive.
	c := NewClient(s.URL(), 10*time.Second)
	impatient := NewClient(s.URL(), 100*time.Millisecond)
	ctx := context.Background()

	s.Next(BehaveDecline)
	op := uuid.New()
	res, err := c.Charge(ctx, req(op))
	if err != nil || res.Outcome != Declined {
		t.Fatalf("decline: %+v, %v", res, err)
	}

	s.Next(BehaveTimeoutAfterCharge)
	op = uuid.New()
	if _, err := impatient.Charge(ctx, req(op)); !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("timeout after charge: err = %v, want ErrOutcomeUnknown", err)
	}
	inq, err := c.Inquire(ctx, op)
	if err != nil || inq.Outcome != Succeeded {
		t.Fatalf("inquiry after timeout: %+v, %v (the money moved)", inq, err)
	}

	s.Next(BehaveDown)
	op = uuid.New()
	if _, err := c.Charge(ctx, req(op)); !errors.Is(err, ErrNotProcessed) {
		t.Fatalf("down: err = %v, want ErrNotProcessed", err)
	}
	if inq, _ := c.Inquire(ctx, op); inq.Outcome != NotFound {
		t.Fatalf("down charge left a record: %+v", inq)
	}

	s.Next(BehaveSlow)
	op = uuid.New()
	if _, err := impatient.Charge(ctx, req(op)); !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("slow beyond the client timeout: err = %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if inq, _ := c.Inquire(ctx, op); inq.Outcome == Succeeded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("slow charge never landed")
		}
		time.Sleep(50 * time.Millisecond)
	}

	s.SetInquiryFor(op, InquiryUnknown)
	if inq, err := c.Inquire(ctx, op); err != nil || inq.Outcome != Unknown {
		t.Fatalf("inquiry unknown: %+v, %v", inq, err)
	}
	if s.MoneyMoved() != 2 {
		t.Fatalf("money moved %d times, want 2 (timeout-after-charge and slow)", s.MoneyMoved())
	}
}

func TestConnectionRefusedIsNotProcessed(t *testing.T) {
	t.Parallel()
	c := NewClient(refusingURL(t), time.Second)
	if _, err := c.Charge(context.Background(), req(uuid.New())); !errors.Is(err, ErrNotProcessed) {
		t.Fatalf("err = %v, want ErrNotProcessed", err)
	}
}

// refusingURL is an address where a connection is refused for the whole
// test: the port is bound but never listened on, so no parallel test can
// take it over (a closed listener's port can be reused at once, and then a
// stranger answers or resets instead of refusing).
func refusingURL(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("http://127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

func TestAdminEndpoints(t *testing.T) {
	t.Parallel()
	s := startSim(t, SimConfig{})
	resp, err := http.Post(s.URL()+"/admin/next", "application/json", stringsReader(`{"behaviours":["decline"]}`))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("admin next: %v %v", resp, err)
	}
	resp.Body.Close()
	res, err := NewClient(s.URL(), time.Second).Charge(context.Background(), req(uuid.New()))
	if err != nil || res.Outcome != Declined {
		t.Fatalf("queued decline not applied: %+v %v", res, err)
	}
	resp, err = http.Post(s.URL()+"/admin/next", "application/json", stringsReader(`{"behaviours":["explode"]}`))
	if err != nil || resp.StatusCode != 400 {
		t.Fatalf("unknown behaviour accepted: %v %v", resp, err)
	}
	resp.Body.Close()
}
