package payments

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/payments/provider"
)

func debits(e *env, account int64) int {
	return e.count(`SELECT count(*) FROM ledger_entry WHERE account_id = $1 AND entry_type = 'debit'`, account)
}

func counterValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					match = true
				}
			}
			if !match {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	t.Fatalf("metric %s{%s=%q} not found", name, label, value)
	return 0
}

// Same key, 100 sequential requests → one financial effect, 99 identical replays.
func TestSameKeySequential(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	key := newKey()
	body := payBody("inv-seq", 1, "1000")
	first := e.post(key, body)
	if first.status != 201 || first.replayed {
		t.Fatalf("first: %d %v %s", first.status, first.retryAfter, first.body)
	}
	for i := 0; i < 99; i++ {
		a := e.post(key, body)
		if a.status != 201 || !a.replayed || !bytes.Equal(a.body, first.body) {
			t.Fatalf("replay %d: %d replayed=%v body %s (first %s)", i, a.status, a.replayed, a.body, first.body)
		}
	}
	if n := e.sim.MoneyMoved(); n != 1 {
		t.Fatalf("provider moved money %d times, want 1", n)
	}
	if n := len(e.sim.Charges()); n != 1 {
		t.Fatalf("provider saw %d operations, want 1", n)
	}
	if n := debits(e, 1); n != 1 {
		t.Fatalf("ledger debits = %d, want 1", n)
	}
	if b := e.accountState(1).Balance.String(); b != "4000" {
		t.Fatalf("balance %s, want 4000", b)
	}
	e.checkBooks(1)
}

// Same key, 100 parallel requests (with differently formatted but equal
// bodies) → one charge; every other answer is 409 + Retry-After or the
// identical replay.
func TestSameKeyParallel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{sim: provider.SimConfig{SlowDelay: 300 * time.Millisecond}})
	e.account(1, "5000")
	e.sim.Next(provider.BehaveSlow) // keep the owner busy while the others arrive
	key := newKey()
	// One request in three spellings of its amount (paymentsapi's tests
	// spell whole bodies differently).
	bodies := []Request{payBody("inv-par", 1, "1000"), payBody("inv-par", 1, "1000.00"), payBody("inv-par", 1, "1e3")}
	answers := make([]answer, 100)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = e.post(key, bodies[i%len(bodies)])
		}()
	}
	close(start)
	wg.Wait()
	var created []answer
	conflicts := 0
	for _, a := range answers {
		switch {
		case a.status == 201 && !a.replayed:
			created = append(created, a)
		case a.status == 201:
		case a.status == 409:
			if a.retryAfter == 0 || a.code(t) != CodeInProgress {
				t.Fatalf("409 without Retry-After or code: %v %s", a.retryAfter, a.body)
			}
			conflicts++
		default:
			t.Fatalf("unexpected answer %d %s", a.status, a.body)
		}
	}
	if len(created) != 1 {
		t.Fatalf("%d requests created a payment, want exactly 1", len(created))
	}
	for _, a := range answers {
		if a.status == 201 && !bytes.Equal(a.body, created[0].body) {
			t.Fatalf("replay differs from the first answer:\n%s\n%s", a.body, created[0].body)
		}
	}
	if n := e.sim.MoneyMoved(); n != 1 {
		t.Fatalf("provider moved money %d times, want 1", n)
	}
	if n := debits(e, 1); n != 1 {
		t.Fatalf("ledger debits = %d, want 1", n)
	}
	if got := counterValue(t, e.reg, "sluice_idempotency_conflicts_total", "kind", ConflictInProgress); int(got) != conflicts {
		t.Fatalf("in_progress conflicts metric = %v, 409 answers = %d", got, conflicts)
	}
	e.checkBooks(1)
}

// Same key, other amount → 422; the first payment is untouched.
func TestSameKeyOtherPayload(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	key := newKey()
	first := e.post(key, payBody("inv-x", 1, "1000"))
	if first.status != 201 {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	before := e.accountState(1)
	otherCustomer := payBody("inv-x", 1, "1000")
	otherCustomer.Customer.Email = "bob@example.com"
	for _, other := range []Request{payBody("inv-x", 1, "1001"), payBody("inv-y", 1, "1000"), otherCustomer} {
		a := e.post(key, other)
		if a.status != 422 || a.code(t) != CodeKeyReused {
			t.Fatalf("other payload: %d %s", a.status, a.body)
		}
	}
	after := e.accountState(1)
	if !before.Balance.Equal(after.Balance) || !before.Reserved.Equal(after.Reserved) {
		t.Fatalf("account changed: %+v → %+v", before, after)
	}
	if n := e.count(`SELECT count(*) FROM payment`); n != 1 {
		t.Fatalf("payments = %d", n)
	}
	again := e.post(key, payBody("inv-x", 1, "1000"))
	if again.status != 201 || !bytes.Equal(again.body, first.body) {
		t.Fatalf("the original is no longer replayed: %d %s", again.status, again.body)
	}
	if got := counterValue(t, e.reg, "sluice_idempotency_conflicts_total", "kind", ConflictPayloadMismatch); got != 3 {
		t.Fatalf("payload_mismatch metric = %v, want 3", got)
	}
	if e.sim.MoneyMoved() != 1 {
		t.Fatalf("money moved %d times", e.sim.MoneyMoved())
	}
}

// 4 keys × 1,000 against 2,000, concurrently (on several accounts at once)
// → at most 2 succeed per account, balance ≥ 0, the books add up.
func TestConcurrentKeysBalance(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	const accounts = 5
	for a := int64(1); a <= accounts; a++ {
		e.account(a, "2000")
	}
	type result struct {
		account int64
		key     string
		body    Request
		a       answer
	}
	results := make([]result, 0, accounts*4)
	for a := int64(1); a <= accounts; a++ {
		for i := 0; i < 4; i++ {
			results = append(results, result{account: a, key: newKey(), body: payBody(fmt.Sprintf("inv-%d-%d", a, i), a, "1000")})
		}
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i].a = e.post(results[i].key, results[i].body)
		}()
	}
	close(start)
	wg.Wait()
	ok := map[int64]int{}
	for _, r := range results {
		switch {
		case r.a.status == 201:
			ok[r.account]++
		case r.a.status == 402 && r.a.code(t) == CodeInsufficientFunds:
			// stored as the key's result: a retry gets the same answer
			again := e.post(r.key, r.body)
			if again.status != 402 || !again.replayed || !bytes.Equal(again.body, r.a.body) {
				t.Fatalf("402 not stored as the key's result: %d %s", again.status, again.body)
			}
		default:
			t.Fatalf("unexpected answer %d %s", r.a.status, r.a.body)
		}
	}
	for a := int64(1); a <= accounts; a++ {
		if ok[a] > 2 {
			t.Fatalf("account %d: %d payments of 1,000 succeeded against 2,000", a, ok[a])
		}
		if ok[a] != 2 {
			t.Errorf("account %d: %d succeeded, want 2 (the provider never declines here)", a, ok[a])
		}
		e.checkBooks(a)
	}
	if got := counterValue(t, e.reg, "sluice_payments_total", "outcome", "insufficient_funds"); got != accounts*2 {
		t.Fatalf("insufficient_funds metric = %v", got)
	}
}

// A client that mints a new key per retry → the business identity refuses
// the second payment.
func TestNewKeySameInvoice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	body := payBody("inv-dup", 1, "1000")
	if a := e.post(newKey(), body); a.status != 201 {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	key2 := newKey()
	a := e.post(key2, body)
	if a.status != 422 || a.code(t) != CodeDuplicateInvoice || a.retryAfter > 0 {
		t.Fatalf("second key, same invoice: %d %v %s", a.status, a.retryAfter, a.body)
	}
	if again := e.post(key2, body); again.status != 422 || !again.replayed {
		t.Fatalf("duplicate_invoice not stored as the key's result: %d %v", again.status, again.retryAfter)
	}
	// Concurrently, many new keys for one new invoice: one payment.
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := e.post(newKey(), payBody("inv-dup-2", 1, "10"))
			mu.Lock()
			statuses[a.status]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if statuses[201] != 1 || statuses[422] != 19 {
		t.Fatalf("20 keys for one invoice: %v, want one 201 and 19 422", statuses)
	}
	if e.sim.MoneyMoved() != 2 || debits(e, 1) != 2 {
		t.Fatalf("money moved %d times, %d debits; want 2", e.sim.MoneyMoved(), debits(e, 1))
	}
	if got := counterValue(t, e.reg, "sluice_idempotency_conflicts_total", "kind", ConflictBusinessDuplicate); got != 20 {
		t.Fatalf("business_duplicate metric = %v, want 20", got)
	}
	e.checkBooks(1)
}

func TestDeclineAndProviderDownRelease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "1000")
	e.sim.Next(provider.BehaveDecline, provider.BehaveDown)
	a := e.post(newKey(), payBody("inv-decl", 1, "600"))
	if a.status != 402 || a.code(t) != CodeDeclined || a.json(t)["status"] != "failed" {
		t.Fatalf("decline: %d %s", a.status, a.body)
	}
	b := e.post(newKey(), payBody("inv-down", 1, "600"))
	if b.status != 502 || b.code(t) != CodeProviderUnavailable {
		t.Fatalf("down: %d %s", b.status, b.body)
	}
	acc := e.accountState(1)
	if acc.Balance.String() != "1000" || !acc.Reserved.IsZero() {
		t.Fatalf("a failed payment kept money: %+v", acc)
	}
	if n := e.count(`SELECT count(*) FROM balance_reservation WHERE status = 'released'`); n != 2 {
		t.Fatalf("released reservations = %d", n)
	}
	if n := e.count(`SELECT count(*) FROM outbox_event WHERE event_type = 'payment.failed.v1'`); n != 2 {
		t.Fatalf("failed events = %d", n)
	}
	// The money is available again.
	if c := e.post(newKey(), payBody("inv-after", 1, "1000")); c.status != 201 {
		t.Fatalf("after release: %d %s", c.status, c.body)
	}
	e.checkBooks(1)
}

// The key expires after its retry window; payments and ledger stay, so the
// business identity still refuses a second payment of the invoice.
func TestExpiryPrunesKeysOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	e.svc.cfg.ExpiryBatch = 2
	keys := []string{newKey(), newKey(), newKey(), newKey(), newKey()}
	var firstOp string
	for i, k := range keys {
		a := e.post(k, payBody(fmt.Sprintf("inv-exp-%d", i), 1, "10"))
		if a.status != 201 {
			t.Fatalf("%d %s", a.status, a.body)
		}
		if i == 0 {
			firstOp = opOf(t, a).String()
		}
	}
	ctx := context.Background()
	if n, err := e.svc.PruneOnce(ctx); err != nil || n != 0 {
		t.Fatalf("pruned %d keys inside the window (%v)", n, err)
	}
	e.clk.Advance(72*time.Hour + time.Minute)
	n, err := e.svc.PruneOnce(ctx)
	if err != nil || n != 5 {
		t.Fatalf("pruned %d, %v; want 5 in batches of 2", n, err)
	}
	if e.count(`SELECT count(*) FROM payment`) != 5 || debits(e, 1) != 5 {
		t.Fatal("pruning touched payments or the ledger")
	}
	// The same key and payload after expiry: a final answer naming the
	// payment that paid the invoice, in words that are true for it.
	a := e.post(keys[0], payBody("inv-exp-0", 1, "10"))
	m := a.json(t)
	if a.status != 422 || a.code(t) != CodeDuplicateInvoice || a.retryAfter > 0 ||
		m["operation_id"] != firstOp || m["status"] != string(StatusCompleted) ||
		!strings.Contains(m["message"].(string), "already paid by operation "+firstOp) {
		t.Fatalf("expired key replayed after pruning: %d %v %s", a.status, a.retryAfter, a.body)
	}
	if e.sim.MoneyMoved() != 5 {
		t.Fatalf("money moved %d times", e.sim.MoneyMoved())
	}
}

var errCrash = errors.New("test: process killed")
