package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/pii"
	"github.com/sluice-dev/sluice/internal/pii/piitest"
)

func search(t *testing.T, e *env, field, typed string) []uuid.UUID {
	t.Helper()
	found, err := FindByCustomer(context.Background(), e.pool, e.kr, field, typed, SearchPage{})
	if err != nil {
		t.Fatalf("FindByCustomer(%s, %q): %v", field, typed, err)
	}
	ops := make([]uuid.UUID, len(found))
	for i, p := range found {
		ops[i] = p.OperationID
	}
	return ops
}

func sameOps(a, b []uuid.UUID) bool {
	as, bs := make([]string, len(a)), make([]string, len(b))
	for i := range a {
		as[i] = a[i].String()
	}
	for i := range b {
		bs[i] = b[i].String()
	}
	sort.Strings(as)
	sort.Strings(bs)
	return strings.Join(as, ",") == strings.Join(bs, ",")
}

// Search by email and by tax id finds exactly the customer's payments,
// however the operator cased or spaced the input; a near miss finds none.
func TestFindByCustomer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "1000")
	pay := func(invoice string, c Customer) uuid.UUID {
		r := payBody(invoice, 1, "10")
		r.Customer = c
		return opOf(t, e.post(newKey(), r))
	}
	a1 := pay("inv-a1", Customer{Name: "Ayşe Yılmaz", Email: "ayse@example.com", TaxID: "12345678901"})
	a2 := pay("inv-a2", Customer{Name: "Ayşe Yılmaz", Email: "ayse@example.com", TaxID: "55555555555"})
	b := pay("inv-b", Customer{Name: "Mehmet Kaya", Email: "mehmet@example.com", TaxID: "98765432100"})
	noTax := pay("inv-c", Customer{Name: "Can Er", Email: "can@example.com"})

	cases := []struct {
		field, typed string
		want         []uuid.UUID
	}{
		{pii.FieldEmail, "ayse@example.com", []uuid.UUID{a1, a2}},
		{pii.FieldEmail, "  AYSE@Example.COM ", []uuid.UUID{a1, a2}},
		{pii.FieldEmail, "mehmet@example.com", []uuid.UUID{b}},
		{pii.FieldEmail, "can@example.com", []uuid.UUID{noTax}},
		{pii.FieldEmail, "ayse@example.co", nil},
		{pii.FieldEmail, "ayse@example.com.", nil},
		{pii.FieldTaxID, "12345678901", []uuid.UUID{a1}},
		{pii.FieldTaxID, " 123 456-789 01", []uuid.UUID{a1}},
		{pii.FieldTaxID, "123.456.789.01", []uuid.UUID{a1}},
		{pii.FieldTaxID, "98765432100", []uuid.UUID{b}},
		{pii.FieldTaxID, "1234567890", nil},
		{pii.FieldTaxID, "123456789012", nil},
	}
	for _, c := range cases {
		if got := search(t, e, c.field, c.typed); !sameOps(got, c.want) {
			t.Errorf("search %s %q = %v, want %v", c.field, c.typed, got, c.want)
		}
	}
	// Keyset pages: one at a time, in operation id order, none twice.
	ctx := context.Background()
	first, err := FindByCustomer(ctx, e.pool, e.kr, pii.FieldEmail, "ayse@example.com", SearchPage{Limit: 1})
	if err != nil || len(first) != 1 {
		t.Fatalf("first page: %v %v", first, err)
	}
	second, err := FindByCustomer(ctx, e.pool, e.kr, pii.FieldEmail, "ayse@example.com", SearchPage{After: first[0].OperationID, Limit: 1})
	if err != nil || len(second) != 1 || second[0].OperationID == first[0].OperationID {
		t.Fatalf("second page: %v %v", second, err)
	}
	if rest, _ := FindByCustomer(ctx, e.pool, e.kr, pii.FieldEmail, "ayse@example.com", SearchPage{After: second[0].OperationID}); len(rest) != 0 {
		t.Fatalf("third page: %v", rest)
	}
	for _, bad := range [][2]string{{"name", "Ayşe"}, {pii.FieldEmail, "  "}, {pii.FieldTaxID, " - "}, {"customer_email_bidx = customer_email_bidx OR true --", "x"}} {
		if _, err := FindByCustomer(ctx, e.pool, e.kr, bad[0], bad[1], SearchPage{}); !errors.Is(err, ErrInvalidSearch) {
			t.Errorf("search %q %q: err = %v, want ErrInvalidSearch", bad[0], bad[1], err)
		}
	}
}

// A customer value copied to another payment does not open there: the
// screen shows it undecryptable.
func TestCustomerValueMovedToAnotherPaymentDoesNotOpen(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "1000")
	a := e.payment(opOf(t, e.post(newKey(), payBody("inv-1", 1, "10"))))
	b := e.payment(opOf(t, e.post(newKey(), payBody("inv-2", 1, "10"))))
	if got := e.svc.MaskedCustomer(a); got["email"] != "a***@e***.com" || got["tax_id"] != "*******01" || got["name"] != "A*** Y***" {
		t.Fatalf("masked: %v", got)
	}
	b.Customer["email"] = a.Customer["email"]
	b.Customer["name"] = a.Customer["email"] // another field, too
	if got := e.svc.MaskedCustomer(b); got["email"] != pii.Undecryptable || got["name"] != pii.Undecryptable || got["tax_id"] != "*******01" {
		t.Fatalf("values moved from another payment or field show %v", got)
	}
}

// Rotation stopped halfway (its context cancelled after k batches) and run
// again finishes: every customer value is a v2 envelope under the new key,
// every value opens to what it was, tax id blind indexes are filled in, and
// a value under a key the ring lacks is left as it was.
func TestRotateCustomersStoppedHalfwayResumes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	blind := piitest.Bytes(t, 32)
	oldKey, nextKey, lostKey := piitest.Key(t, "old"), piitest.Key(t, "new"), piitest.Key(t, "lost")
	e := newEnv(t, envOpts{kr: piitest.Ring(t, blind, oldKey)})
	e.account(1, "100000")
	pool := e.pool

	// 13 payments made under the old key; the first 7 turned back into
	// legacy rows (v1 envelopes, no tax id index), as an older release
	// stored them.
	want := map[uuid.UUID]map[string]string{}
	for i := range 13 {
		c := Customer{Name: fmt.Sprintf("Customer %c", 'A'+i), Email: fmt.Sprintf("c%d@example.com", i), TaxID: fmt.Sprintf("100000000%02d", i)}
		r := payBody(fmt.Sprintf("inv-%d", i), 1, "10")
		r.Customer = c
		op := opOf(t, e.post(newKey(), r))
		clear := map[string]string{"name": c.Name, "email": c.Email, "tax_id": c.TaxID}
		if i < 7 {
			legacy := map[string]string{}
			for f, v := range clear {
				legacy[f] = piitest.SealV1(t, oldKey, f, v)
			}
			setCustomer(t, pool, op, legacy)
		}
		want[op] = clear
	}
	lostOp := opOf(t, e.post(newKey(), payBody("inv-lost", 1, "10")))
	lostEnv, _ := piitest.Ring(t, blind, lostKey).Seal(CustomerPlace(lostOp), "email", "lost@example.com")
	setCustomer(t, pool, lostOp, map[string]string{"email": lostEnv})

	kr := piitest.Ring(t, blind, nextKey, oldKey)
	n, err := CountStaleCustomers(ctx, pool, kr)
	if err != nil || n != 14 {
		t.Fatalf("stale rows = %d, %v; want 14", n, err)
	}
	dry, err := RotateCustomers(ctx, pool, kr, RotateOptions{Batch: 3, DryRun: true})
	if err != nil || dry.Rows != 14 || dry.Rewritten != 39 || dry.Indexed != 7 || dry.Failed != 1 {
		t.Fatalf("dry run: %+v, %v", dry, err)
	}
	if n, _ := CountStaleCustomers(ctx, pool, kr); n != 14 {
		t.Fatalf("the dry run changed rows: %d stale", n)
	}

	stopCtx, stop := context.WithCancel(ctx)
	batches := 0
	first, err := RotateCustomers(stopCtx, pool, kr, RotateOptions{Batch: 3, Progress: func(int64) {
		if batches++; batches == 2 {
			stop()
		}
	}})
	if !errors.Is(err, context.Canceled) || first.Rows != 6 {
		t.Fatalf("stopped rotation: %+v, %v; want 6 rows then context.Canceled", first, err)
	}
	if n, _ := CountStaleCustomers(ctx, pool, kr); n != 8 {
		t.Fatalf("after two batches of three, %d rows stale; want 8", n)
	}
	rest, err := RotateCustomers(ctx, pool, kr, RotateOptions{Batch: 3})
	if err != nil || rest.Rows != 8 || first.Rewritten+rest.Rewritten != 39 || first.Indexed+rest.Indexed != 7 || rest.Failed != 1 {
		t.Fatalf("resumed rotation: %+v then %+v, %v", first, rest, err)
	}

	c, err := CensusCustomers(ctx, pool, kr, 4)
	if err != nil {
		t.Fatal(err)
	}
	if c.Values[pii.KeyVersion{KeyID: "new", Version: pii.V2}] != 39 || len(c.Values) != 1 || c.Stale != 0 || c.UnknownKey["lost"] != 1 {
		t.Fatalf("census after rotation: %+v", c)
	}
	newOnly := piitest.Ring(t, blind, nextKey) // the old key can go now
	for op, clear := range want {
		p, err := Get(ctx, pool, op)
		if err != nil {
			t.Fatal(err)
		}
		for f, v := range clear {
			if got, err := newOnly.Open(CustomerPlace(op), f, p.Customer[f]); err != nil || got != v {
				t.Fatalf("%s %s after rotation = %q, %v; want %q", op, f, got, err, v)
			}
		}
		found, err := FindByCustomer(ctx, pool, kr, pii.FieldTaxID, clear["tax_id"], SearchPage{})
		if err != nil || len(found) == 0 {
			t.Fatalf("tax id index of %s not filled: %v", op, err)
		}
	}
	if p, _ := Get(ctx, pool, lostOp); p.Customer["email"] != lostEnv {
		t.Fatal("a value under a missing key was changed")
	}
	if again, err := RotateCustomers(ctx, pool, kr, RotateOptions{Batch: 3}); err != nil || again.Rewritten != 0 || again.Rows != 1 {
		t.Fatalf("a third run: %+v, %v", again, err)
	}
}

// setCustomer stores envelopes as an older release did (no tax id index).
func setCustomer(t *testing.T, pool *pgxpool.Pool, op uuid.UUID, customer map[string]string) {
	t.Helper()
	raw, err := json.Marshal(customer)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `UPDATE payment SET customer = $2, customer_tax_id_bidx = NULL WHERE operation_id = $1`, op, raw); err != nil {
		t.Fatal(err)
	}
}
