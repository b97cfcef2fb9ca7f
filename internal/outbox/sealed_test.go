package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/pii"
	"github.com/sluice-dev/sluice/internal/pii/piitest"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// Canary personal data of an order, recognisable anywhere it might leak.
var orderCanary = []string{"Zebulon Canaryfield", "Canaryfield", "zebulon@canary-mail.example", "canary-mail", "+90 555 010 99 77", "555 010", "Canary Lane 7"}

// insertSealed seals payload for a new event id and writes it, as a
// producer does: the id is made first because the sealed fields are bound
// to it.
func insertSealed(t *testing.T, pool *pgxpool.Pool, kr *pii.Keyring, eventType, agg string, payload string) uuid.UUID {
	t.Helper()
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := pii.SealPayload(kr, eventType, id.String(), []byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	err = db.WithTx(context.Background(), pool, func(tx pgx.Tx) error {
		_, err := outbox.Insert(context.Background(), tx, outbox.Event{ID: id, AggregateType: "order", AggregateID: agg,
			Topic: "sluice.orders", EventType: eventType, Payload: sealed})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

const canaryOrder = `{"order_id":7,"status":"placed","amount":"10.00","customer":{"name":"Zebulon Canaryfield",` +
	`"email":"zebulon@canary-mail.example","phone":"+90 555 010 99 77"},"shipping_address":"Canary Lane 7"}`

// SECURITY case 12 for events: an order event carrying canary personal data
// is sealed before it is written; the canary is never in clear in the
// payload column, in what the relay publishes, or in the relay's debug log,
// and a consumer with the keys gets it back.
func TestSealedOrderEventCanaryNeverInClear(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	kr := piitest.Ring(t, piitest.Bytes(t, 32), piitest.Key(t, "k1"))
	id := insertSealed(t, pool, kr, "order.placed.v1", "7", canaryOrder)

	logs := &testkit.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	pub := &pubLog{}
	// The broker refuses the first publish with an error that echoes the
	// payload, as some do: the relay logs it and stores it as last_error.
	refused := false
	mp := &memPublisher{name: "r", log: pub, before: func(_ context.Context, msg broker.Message) error {
		if !refused {
			refused = true
			return fmt.Errorf("broker refused message %s", msg.Payload)
		}
		return nil
	}}
	clk := newClock()
	r, err := outbox.NewRelay(pool, mp, outbox.RelayConfig{Name: "r", DisableListen: true, Now: clk.Now}, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := r.RunOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Hour)
	}
	got := pub.all()
	if len(got) != 1 || got[0].Msg.ID != id.String() {
		t.Fatalf("published %v", got)
	}
	if !strings.Contains(logs.String(), "broker refused message") {
		t.Fatalf("the relay did not log the refusal; the test would prove nothing:\n%s", logs.String())
	}
	var stored string
	if err := pool.QueryRow(context.Background(), `SELECT concat_ws(' ', payload::text, headers::text, last_error) FROM outbox_event`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stored, "broker refused message") {
		t.Fatalf("last_error was not stored; the test would prove nothing: %s", stored)
	}
	for where, text := range map[string]string{"the payload column": stored, "the published message": string(got[0].Msg.Payload), "the debug log": logs.String()} {
		for _, c := range orderCanary {
			if strings.Contains(text, c) {
				t.Errorf("%s carries %q in clear:\n%s", where, c, text)
			}
		}
	}
	opened, err := pii.OpenPayload(kr, got[0].Msg.EventType, got[0].Msg.ID, got[0].Msg.Payload)
	if err != nil || !strings.Contains(string(opened), "zebulon@canary-mail.example") {
		t.Fatalf("the consumer's view: %s, %v", opened, err)
	}
}

// Rotation of payloads stopped halfway and run again finishes: every sealed
// value is v2 under the new key, every payload opens to what it was, and
// the events' status is untouched.
func TestRewritePayloadsStoppedHalfwayResumes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	blind := piitest.Bytes(t, 32)
	oldKey, newKey := piitest.Key(t, "old"), piitest.Key(t, "new")
	oldRing := piitest.Ring(t, blind, oldKey)
	var ids []uuid.UUID
	for i := range 10 {
		ids = append(ids, insertSealed(t, pool, oldRing, "order.placed.v1", string(rune('a'+i)), canaryOrder))
	}
	// Legacy payment events: the payment's v1 envelopes copied into the payload.
	for i := range 3 {
		legacy := `{"operation_id":"op","amount":"1.00","customer":{"email":"` + piitest.SealV1(t, oldKey, "email", "legacy@example.com") + `"}}`
		id := uuid.Must(uuid.NewV7())
		err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Insert(ctx, tx, outbox.Event{ID: id, AggregateType: "payment", AggregateID: string(rune('a' + i)),
				Topic: "sluice.payments", EventType: "payment.requested.v1", Payload: json.RawMessage(legacy)})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// Events with nothing sealed are never visited.
	for range 2 {
		insertSealed(t, pool, oldRing, "order.paid.v1", "z", `{"order_id":1,"status":"paid"}`)
	}
	kr := piitest.Ring(t, blind, newKey, oldKey)
	before := map[uuid.UUID]string{}
	for _, id := range ids {
		before[id] = openEvent(t, pool, kr, id)
	}
	anyEnv, current := kr.PayloadMarkers()
	match := outbox.PayloadMatch{Any: anyEnv, Current: current}
	if n, err := outbox.CountPayloads(ctx, pool, match); err != nil || n != 13 {
		t.Fatalf("payloads to rotate: %d, %v; want 13", n, err)
	}
	reseal := func(r outbox.PayloadRow) ([]byte, error) {
		out, _, failed, err := kr.ResealPayload(r.EventType, r.ID.String(), r.Payload)
		if failed > 0 {
			return nil, errors.New("a value did not open")
		}
		return out, err
	}
	if v, w, err := outbox.RewritePayloads(ctx, pool, match, outbox.RewriteOptions{Batch: 4, DryRun: true}, reseal); err != nil || v != 13 || w != 13 {
		t.Fatalf("dry run: %d visited, %d rewritten, %v", v, w, err)
	}
	stopCtx, stop := context.WithCancel(ctx)
	batches := 0
	v, w, err := outbox.RewritePayloads(stopCtx, pool, match, outbox.RewriteOptions{Batch: 3, Progress: func(int64) {
		if batches++; batches == 2 {
			stop()
		}
	}}, reseal)
	if !errors.Is(err, context.Canceled) || v != 6 || w != 6 {
		t.Fatalf("stopped rewrite: %d visited, %d rewritten, %v", v, w, err)
	}
	if n, _ := outbox.CountPayloads(ctx, pool, match); n != 7 {
		t.Fatalf("after two batches of three, %d payloads left; want 7", n)
	}
	if v, w, err := outbox.RewritePayloads(ctx, pool, match, outbox.RewriteOptions{Batch: 3}, reseal); err != nil || v != 7 || w != 7 {
		t.Fatalf("resumed rewrite: %d visited, %d rewritten, %v", v, w, err)
	}
	if n, _ := outbox.CountPayloads(ctx, pool, match); n != 0 {
		t.Fatalf("%d payloads left after the rotation", n)
	}
	newOnly := piitest.Ring(t, blind, newKey)
	var c pii.Census
	for _, id := range ids {
		if got := openEvent(t, pool, newOnly, id); got != before[id] {
			t.Fatalf("event %s after rotation:\n%s\nwant\n%s", id, got, before[id])
		}
		row, _ := outbox.Get(ctx, pool, id)
		newOnly.CensusPayload(&c, row.EventType, id.String(), row.Payload)
		if row.Status != outbox.StatusPending || row.Attempts != 0 {
			t.Fatalf("rotation changed the event's state: %s, %d attempts", row.Status, row.Attempts)
		}
	}
	if c.Values[pii.KeyVersion{KeyID: "new", Version: pii.V2}] != 43 || len(c.Values) != 1 || c.Undecryptable() != 0 {
		t.Fatalf("census after rotation: %+v", c)
	}
}

func openEvent(t *testing.T, pool *pgxpool.Pool, kr *pii.Keyring, id uuid.UUID) string {
	t.Helper()
	row, err := outbox.Get(context.Background(), pool, id)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pii.OpenPayload(kr, row.EventType, id.String(), row.Payload)
	if err != nil {
		t.Fatalf("event %s does not open: %v", id, err)
	}
	return string(out)
}
