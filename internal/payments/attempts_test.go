package payments

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-dev/sluice/internal/payments/provider"
)

// checkDuplicate asserts the final duplicate answer: 422 duplicate_invoice,
// no Retry-After, naming the attempt that holds the invoice.
func checkDuplicate(t *testing.T, a answer, holder string, status Status, words string) {
	t.Helper()
	m := a.json(t)
	if a.status != 422 || m["code"] != CodeDuplicateInvoice || a.retryAfter > 0 ||
		m["operation_id"] != holder || m["status"] != string(status) || !strings.Contains(m["message"].(string), words) {
		t.Fatalf("duplicate answer: %d Retry-After=%d %s; want 422 %s naming %s (%s, %q)", a.status, a.retryAfter, a.body, CodeDuplicateInvoice, holder, status, words)
	}
}

// A decline and a provider outage say nothing was charged: each time, a new
// key for the same invoice starts the next attempt, visible on the answer,
// on GET, on the row and in the events. Once an attempt completed, a new
// key gets the final duplicate answer naming it.
func TestFailedAttemptsDoNotBlockTheInvoice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "1000")
	e.sim.Next(provider.BehaveDecline, provider.BehaveDown)
	body := payBody("inv-again", 1, "100")
	first := e.post(newKey(), body)
	if first.status != 402 || first.json(t)["attempt"] != 1.0 {
		t.Fatalf("attempt 1 (declined): %d %s", first.status, first.body)
	}
	second := e.post(newKey(), body)
	if second.status != 502 || second.code(t) != CodeProviderUnavailable || second.json(t)["attempt"] != 2.0 {
		t.Fatalf("attempt 2 (provider down): %d %s", second.status, second.body)
	}
	third := e.post(newKey(), body)
	if third.status != 201 || third.json(t)["attempt"] != 3.0 {
		t.Fatalf("attempt 3: %d %s", third.status, third.body)
	}
	op := opOf(t, third)
	if g := e.get(op.String()); g.status != 200 || g.json(t)["attempt"] != 3.0 {
		t.Fatalf("GET attempt 3: %d %s", g.status, g.body)
	}
	if p := e.payment(op); p.Attempt != 3 || p.Status != StatusCompleted {
		t.Fatalf("row: attempt %d status %s", p.Attempt, p.Status)
	}
	rows, err := e.pool.Query(context.Background(), `SELECT payload FROM outbox_event WHERE aggregate_id = $1`, op.String())
	if err != nil {
		t.Fatal(err)
	}
	events := 0
	for rows.Next() {
		var payload []byte
		if err := rows.Scan(&payload); err != nil {
			t.Fatal(err)
		}
		var ev struct{ Attempt int }
		if err := json.Unmarshal(payload, &ev); err != nil || ev.Attempt != 3 {
			t.Fatalf("event payload without attempt 3: %s", payload)
		}
		events++
	}
	rows.Close()
	if events != 2 {
		t.Fatalf("attempt 3 has %d events, want requested + completed", events)
	}
	dup := e.post(newKey(), body)
	checkDuplicate(t, dup, op.String(), StatusCompleted, "already paid by operation "+op.String())
	if e.sim.MoneyMoved() != 1 || debits(e, 1) != 1 {
		t.Fatalf("money moved %d times, %d debits; want 1", e.sim.MoneyMoved(), debits(e, 1))
	}
	if n := e.count(`SELECT count(*) FROM payment WHERE invoice_id = 'inv-again'`); n != 3 {
		t.Fatalf("payments of the invoice = %d, want 3 attempts", n)
	}
	e.checkBooks(1)
}

// While an attempt is unknown (money may have moved) or still processing, a
// new key is refused with a final answer naming that attempt, and nothing
// reaches the provider.
func TestLiveAttemptBlocksNewKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{providerTimeout: shortTimeout, sim: provider.SimConfig{HangFor: 4 * shortTimeout}})
	e.account(1, "5000")

	// unknown: the provider charged and never answered.
	e.sim.Next(provider.BehaveTimeoutAfterCharge)
	e.sim.SetInquiry(provider.InquiryUnknown)
	unk := e.post(newKey(), payBody("inv-unk", 1, "100"))
	if unk.status != 202 {
		t.Fatalf("timeout: %d %s", unk.status, unk.body)
	}
	unkOp := opOf(t, unk).String()
	checkDuplicate(t, e.post(newKey(), payBody("inv-unk", 1, "100")), unkOp, StatusUnknown, "not confirmed")

	// processing: the owner died after its payment committed.
	e.svc.afterReserve = func(Payment) error { return errCrash }
	if a := e.post(newKey(), payBody("inv-proc", 1, "100")); a.status != 500 {
		t.Fatalf("crashed request: %d %s", a.status, a.body)
	}
	e.svc.afterReserve = nil
	var procOp string
	if err := e.pool.QueryRow(context.Background(), `SELECT operation_id::text FROM payment WHERE invoice_id = 'inv-proc'`).Scan(&procOp); err != nil {
		t.Fatal(err)
	}
	checkDuplicate(t, e.post(newKey(), payBody("inv-proc", 1, "100")), procOp, StatusProcessing, "still in progress")

	if n := len(e.sim.Charges()); n != 1 {
		t.Fatalf("the provider saw %d operations, want only the unknown one", n)
	}
	if got := counterValue(t, e.reg, "sluice_idempotency_conflicts_total", "kind", ConflictBusinessDuplicate); got != 2 {
		t.Fatalf("business_duplicate metric = %v, want 2", got)
	}
}

// After a failed attempt, twenty new keys race for the invoice: exactly one
// starts attempt 2; every other gets the final answer naming it.
func TestConcurrentNewKeysAfterFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	e.sim.Next(provider.BehaveDecline)
	body := payBody("inv-race", 1, "10")
	if a := e.post(newKey(), body); a.status != 402 {
		t.Fatalf("attempt 1: %d %s", a.status, a.body)
	}
	answers := make([]answer, 20)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = e.post(newKey(), body)
		}()
	}
	close(start)
	wg.Wait()
	var winner string
	for _, a := range answers {
		if a.status == 201 {
			if winner != "" {
				t.Fatalf("two new attempts: %s and %s", winner, a.body)
			}
			winner = opOf(t, a).String()
			if a.json(t)["attempt"] != 2.0 {
				t.Fatalf("winner is not attempt 2: %s", a.body)
			}
		}
	}
	if winner == "" {
		t.Fatal("no new attempt started")
	}
	for _, a := range answers {
		if a.status == 201 {
			continue
		}
		if a.status != 422 || a.code(t) != CodeDuplicateInvoice || a.json(t)["operation_id"] != winner || a.retryAfter > 0 {
			t.Fatalf("loser answered %d %v %s; want 422 naming %s", a.status, a.retryAfter, a.body, winner)
		}
	}
	if n := e.count(`SELECT count(*) FROM payment WHERE invoice_id = 'inv-race'`); n != 2 {
		t.Fatalf("payments of the invoice = %d, want 2", n)
	}
	if e.sim.MoneyMoved() != 1 || debits(e, 1) != 1 {
		t.Fatalf("money moved %d times, %d debits; want 1", e.sim.MoneyMoved(), debits(e, 1))
	}
	e.checkBooks(1)
}
