package payments

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/payments/provider"
)

// Every provider call about a payment is kept with its answer and latency:
// a charge that succeeded, then an inquiry about it.
func TestProviderCallsAreRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "1000")
	a := e.post(newKey(), payBody("inv-calls", 1, "10"))
	if a.status != 201 {
		t.Fatalf("payment: %d %s", a.status, a.body)
	}
	op := uuid.MustParse(a.json(t)["operation_id"].(string))
	if _, err := e.svc.Inquire(context.Background(), op); err != nil {
		t.Fatal(err)
	}
	calls, err := ProviderCalls(context.Background(), e.pool, op)
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 2 || calls[0].Op != "charge" || calls[0].Answer != string(provider.Succeeded) ||
		calls[1].Op != "inquire" || calls[1].Answer != string(provider.Succeeded) || calls[0].Duration < 0 || calls[0].StartedAt.IsZero() {
		t.Fatalf("provider calls %+v, want the charge then the inquiry, both answered succeeded", calls)
	}
}
