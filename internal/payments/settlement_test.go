package payments

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/payments/provider"
)

// A provider settlement file resolves unknown payments (a line is a
// definite answer); bad lines are reported and do not stop the rest.
func TestSettlementFile(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{providerTimeout: shortTimeout})
	e.account(1, "5000")
	e.sim.SetInquiry(provider.InquiryUnknown)
	// Three charges that time out, sent at once (each waits out the timeout).
	e.sim.Next(provider.BehaveTimeoutAfterCharge, provider.BehaveTimeoutAfterCharge, provider.BehaveTimeoutAfterCharge)
	unknown := make([]uuid.UUID, 3)
	var wg sync.WaitGroup
	for i, inv := range []string{"inv-s1", "inv-s2", "inv-s3"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := e.post(newKey(), payBody(inv, 1, "100"))
			if a.status != 202 {
				t.Errorf("%s: %d %s", inv, a.status, a.body)
				return
			}
			unknown[i] = opOf(t, a)
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	done := opOf(t, e.post(newKey(), payBody("inv-s4", 1, "100")))
	file := strings.Join([]string{
		"operation_id,outcome,provider_ref",
		unknown[0].String() + ",succeeded,bank-ref-1",
		unknown[1].String() + ",FAILED",
		"not-a-uuid,succeeded",
		unknown[2].String() + ",maybe",
		uuid.NewString() + ",succeeded",
		done.String() + ",failed",
		done.String() + ",succeeded",
		unknown[0].String() + ",succeeded,bank-ref-1",
		"\"unterminated,quote",
	}, "\n") + "\n"
	var lines []SettlementLine
	sum, err := ApplySettlement(context.Background(), e.pool, strings.NewReader(file), SettlementOptions{Source: "eod.csv", Now: e.clk.Now, Report: func(l SettlementLine) { lines = append(lines, l) }})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{LineResolved, LineResolved, LineInvalid, LineInvalid, LineNotFound, LineMismatch, LineAgreed, LineAgreed, LineInvalid}
	if len(lines) != len(want) {
		t.Fatalf("lines: %+v", lines)
	}
	for i, l := range lines {
		if l.Result != want[i] {
			t.Errorf("line %d (%s): %s %q, want %s", l.Line, l.OperationID, l.Result, l.Message, want[i])
		}
	}
	if sum[LineResolved] != 2 || sum[LineInvalid] != 3 || sum[LineMismatch] != 1 {
		t.Fatalf("summary %v", sum)
	}
	p0, p1, p2 := e.payment(unknown[0]), e.payment(unknown[1]), e.payment(unknown[2])
	if p0.Status != StatusCompleted || p0.ProviderRef != "bank-ref-1" || p0.ResolvedBy != "settlement:eod.csv" {
		t.Fatalf("p0 %+v", p0)
	}
	if p1.Status != StatusFailed || e.reservation(unknown[1]) != ReservationReleased {
		t.Fatalf("p1 %s %s", p1.Status, e.reservation(unknown[1]))
	}
	if p2.Status != StatusUnknown || e.reservation(unknown[2]) != ReservationActive {
		t.Fatalf("a bad line changed p2: %s", p2.Status)
	}
	if e.payment(done).Status != StatusCompleted {
		t.Fatal("a mismatch line changed a completed payment")
	}
	e.checkBooks(1)
}
