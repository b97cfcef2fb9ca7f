package main

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
	"github.com/sluice-dev/sluice/internal/pii"
)

func TestPIIKeygen(t *testing.T) {
	t.Parallel()
	code, out, errOut := runConsole(t, nil, "pii", "keygen", "--id", "2026a")
	if code != 0 || !strings.HasPrefix(out, "2026a:") || strings.Count(out, "\n") != 1 || !strings.Contains(errOut, "back it up") {
		t.Fatalf("keygen: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	_, blind, _ := pii.GenerateSpec("x")
	if _, err := pii.ParseKeyring(strings.TrimSpace(out), blind); err != nil {
		t.Fatalf("the printed key is not a PII_KEYS entry: %v", err)
	}
	if code, _, errOut := runConsole(t, nil, "pii", "keygen", "--id", "bad id"); code != 2 || !strings.Contains(errOut, "key id") {
		t.Fatalf("bad id: exit %d, stderr %q", code, errOut)
	}
	if code, _, _ := runConsole(t, nil, "pii", "forget"); code != 2 {
		t.Fatalf("unknown verb: exit %d", code)
	}
	if code, _, errOut := runConsole(t, map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1/x"}, "pii", "check"); code != 1 || !strings.Contains(errOut, "PII_KEYS") {
		t.Fatalf("no keys: exit %d, stderr %q", code, errOut)
	}
}

// check counts values per key id and version; rotate --dry-run changes
// nothing; rotate moves everything to the first key; check then says the
// old key may go, and a ring without the key reports undecryptable values.
func TestPIIRotateAndCheck(t *testing.T) {
	t.Parallel()
	url, pool := testDB(t)
	ctx := context.Background()
	oldSpec, blind, _ := pii.GenerateSpec("old")
	newSpec, _, _ := pii.GenerateSpec("new")
	oldRing, err := pii.ParseKeyring(oldSpec, blind)
	if err != nil {
		t.Fatal(err)
	}
	paymentstest.Account(t, pool, paymentstest.AccountOpts{ID: 1, Balance: "1000"})
	for range 3 {
		op := uuid.Must(uuid.NewV7())
		customer := map[string]string{}
		for f, v := range map[string]string{"name": "Ayşe Yılmaz", "email": "ayse@example.com"} {
			if customer[f], err = oldRing.Seal(payments.CustomerPlace(op), f, v); err != nil {
				t.Fatal(err)
			}
		}
		paymentstest.Payment(t, pool, paymentstest.PaymentOpts{Account: 1, OperationID: op, Customer: customer})
	}
	for range 2 {
		id := uuid.Must(uuid.NewV7())
		payload, err := pii.SealPayload(oldRing, "order.placed.v1", id.String(), []byte(`{"order_id":1,"customer":{"name":"Ayşe Yılmaz"}}`))
		if err != nil {
			t.Fatal(err)
		}
		if err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Insert(ctx, tx, outbox.Event{ID: id, AggregateType: "order", AggregateID: "1", Topic: "t", EventType: "order.placed.v1", Payload: payload})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	envs := map[string]string{"DATABASE_URL": url, "PII_KEYS": newSpec + "," + oldSpec, "PII_BLIND_INDEX_KEY": blind}

	code, out, errOut := runConsole(t, envs, "pii", "check")
	if code != 0 || !strings.Contains(out, "payment customers:\n  key old v2: 6\n") || !strings.Contains(out, "outbox payloads:\n  key old v2: 2\n") ||
		!strings.Contains(out, "key old: 8 value(s) still need it") || !strings.Contains(out, "8 value(s) not current") {
		t.Fatalf("check before: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runConsole(t, envs, "pii", "rotate", "--dry-run", "--batch", "2")
	if code != 0 || !strings.Contains(out, "3 payment(s) and 2 outbox event(s)") || !strings.Contains(out, "6 value(s) would be rewritten") {
		t.Fatalf("dry run: exit %d\n%s%s", code, out, errOut)
	}
	if _, out, _ = runConsole(t, envs, "pii", "check"); !strings.Contains(out, "key old: 8 value(s) still need it") {
		t.Fatalf("the dry run changed values:\n%s", out)
	}
	code, out, errOut = runConsole(t, envs, "pii", "rotate", "--batch", "2")
	if code != 0 || !strings.Contains(out, "payments: 3 visited, 6 value(s) rewritten") || !strings.Contains(out, "outbox: 2 event(s) visited, 2 value(s) rewritten") ||
		!strings.Contains(out, "payments: 2/3") || strings.Contains(out, "\r") {
		t.Fatalf("rotate: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runConsole(t, envs, "pii", "check")
	if code != 0 || !strings.Contains(out, "key new v2: 6") || !strings.Contains(out, "key old: no value needs it") || !strings.Contains(out, "0 value(s) not current") || !strings.Contains(out, ", 0 undecryptable") {
		t.Fatalf("check after: exit %d\n%s%s", code, out, errOut)
	}
	envs["PII_KEYS"] = newSpec
	if code, out, errOut = runConsole(t, envs, "pii", "check"); code != 0 {
		t.Fatalf("check without the old key: exit %d\n%s%s", code, out, errOut)
	}
	otherSpec, _, _ := pii.GenerateSpec("other")
	envs["PII_KEYS"] = otherSpec
	code, out, errOut = runConsole(t, envs, "pii", "check")
	if code != 1 || !strings.Contains(out, "key new (not in PII_KEYS): 6 undecryptable") || !strings.Contains(errOut, "8 value(s) do not open") {
		t.Fatalf("check with a lost key: exit %d\n%s%s", code, out, errOut)
	}
}
