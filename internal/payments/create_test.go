package payments

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/payments/provider"
	"github.com/sluice-dev/sluice/internal/pii"
)

func TestHappyPathAndGet(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	a := e.post(newKey(), payBody("inv-1", 1, "1000"))
	if a.status != 201 {
		t.Fatalf("status %d %s", a.status, a.body)
	}
	m := a.json(t)
	if m["status"] != "completed" || m["amount"] != "1000.00" {
		t.Fatalf("body %s", a.body)
	}
	if bytes.Contains(a.body, []byte("ayse@")) || bytes.Contains(a.body, []byte("Yılmaz")) {
		t.Fatalf("clear PII in the answer: %s", a.body)
	}
	g := e.get(m["operation_id"].(string))
	if g.status != 200 {
		t.Fatalf("GET %d %s", g.status, g.body)
	}
	gm := g.json(t)
	cust := gm["customer"].(map[string]any)
	if cust["name"] != "A*** Y***" || cust["email"] != "a***@e***.com" || cust["tax_id"] != "*******01" {
		t.Fatalf("GET customer not masked as expected: %v", cust)
	}
	acc := e.accountState(1)
	if acc.Balance.String() != "4000" || !acc.Reserved.IsZero() {
		t.Fatalf("account after one payment: %+v", acc)
	}
	e.checkBooks(1)
	// Stored PII is encrypted; events carry no clear PII.
	var customer, payloads string
	_ = e.pool.QueryRow(context.Background(), `SELECT customer::text FROM payment`).Scan(&customer)
	_ = e.pool.QueryRow(context.Background(), `SELECT string_agg(payload::text, ' ') FROM outbox_event`).Scan(&payloads)
	for _, s := range []string{customer, payloads} {
		if strings.Contains(s, "ayse@") || strings.Contains(s, "Ayşe") || strings.Contains(s, "12345678901") {
			t.Fatalf("clear PII stored: %s", s)
		}
	}
	if !strings.Contains(customer, "enc:v2:t1:") {
		t.Fatalf("customer not encrypted under the primary key: %s", customer)
	}
	types := e.count(`SELECT count(*) FROM outbox_event WHERE aggregate_type = 'payment' AND event_type IN ('payment.requested.v1', 'payment.completed.v1')`)
	if types != 2 {
		t.Fatalf("events = %d, want requested + completed", types)
	}
	// Another merchant cannot read it.
	e.merchant = "m-2"
	if g := e.get(m["operation_id"].(string)); g.status != 404 {
		t.Fatalf("other merchant GET = %d", g.status)
	}
	if g := e.get(uuid.NewString()); g.status != 404 || g.code(t) != CodeNotFound {
		t.Fatalf("missing GET = %d %s", g.status, g.body)
	}
}

// A payment written under a key the service no longer holds shows its
// customer as "undecryptable" (no crash; rotation with the old key kept is
// tested in internal/pii).
func TestGetWithRotatedAndLostKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "100")
	a := e.post(newKey(), payBody("inv-rot", 1, "10"))
	op := opOf(t, a)
	p := e.payment(op)
	if got := e.svc.MaskedCustomer(p); got["email"] != "a***@e***.com" {
		t.Fatalf("masked: %v", got)
	}
	newKeys, blind, _ := pii.GenerateSpec("t2")
	lost, err := pii.ParseKeyring(newKeys, blind)
	if err != nil {
		t.Fatal(err)
	}
	svcLost, _ := NewService(e.pool, provider.NewClient(e.sim.URL(), time.Second), lost, Config{}, nil, nil)
	for f, v := range svcLost.MaskedCustomer(p) {
		if v != pii.Undecryptable {
			t.Fatalf("field %s under a lost key shows %q", f, v)
		}
	}
	if counterValue(t, e.reg, "sluice_provider_call_duration_seconds", "op", "charge") != 1 {
		t.Fatal("provider charge latency not observed")
	}
	if counterValue(t, e.reg, "sluice_payments_total", "outcome", "completed") != 1 {
		t.Fatal("payments_total{completed} not counted")
	}
}

func TestListKeyset(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "1000")
	for i := 0; i < 5; i++ {
		if a := e.post(newKey(), payBody(randomInvoice(), 1, "1")); a.status != 201 {
			t.Fatal(a.status)
		}
	}
	ctx := context.Background()
	seen := map[uuid.UUID]bool{}
	f := ListFilter{Status: StatusCompleted, Limit: 2}
	for page := 0; page < 5; page++ {
		ps, err := List(ctx, e.pool, f)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) == 0 {
			break
		}
		for _, p := range ps {
			if seen[p.OperationID] {
				t.Fatalf("payment %s on two pages", p.OperationID)
			}
			seen[p.OperationID] = true
		}
		last := ps[len(ps)-1]
		f.HasCursor, f.AfterTime, f.AfterOpID = true, last.CreatedAt, last.OperationID
	}
	if len(seen) != 5 {
		t.Fatalf("pages held %d payments, want 5", len(seen))
	}
	if ps, _ := List(ctx, e.pool, ListFilter{Status: StatusUnknown}); len(ps) != 0 {
		t.Fatal("status filter ignored")
	}
}

// Keys are scoped by merchant: two merchants may pick the same key.
func TestKeyScopedByMerchant(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.accountOf("m-a", 1, "1000")
	e.accountOf("m-b", 2, "1000")
	key := newKey()
	a := e.postAs("m-a", key, payBody("inv-a", 1, "10"))
	b := e.postAs("m-b", key, payBody("inv-b", 2, "20"))
	if a.status != 201 || b.status != 201 || b.replayed || opOf(t, a) == opOf(t, b) {
		t.Fatalf("same key, two merchants: %d %s / %d %s", a.status, a.body, b.status, b.body)
	}
	// The same invoice id under two merchants is two business identities.
	c := e.postAs("m-b", newKey(), payBody("inv-a", 2, "10"))
	if c.status != 201 || e.sim.MoneyMoved() != 3 {
		t.Fatalf("invoice scoped by merchant: %d %s", c.status, c.body)
	}
}
