package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/outbox"
)

func paymentEvent(agg string) outbox.Event {
	return outbox.Event{
		AggregateType: "account", AggregateID: agg, Topic: "account.opened",
		EventType: "account.opened.v1", Payload: mustJSON(map[string]string{"account": agg}),
	}
}

// The event exists if and only if the business change committed.
func TestInsertFollowsTheCallersTransaction(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	boom := errors.New("business rule failed after the insert")
	// The caller's business table: the test's own, so it depends on no other
	// room's schema.
	if _, err := pool.Exec(ctx, `CREATE TABLE business_account (account_id bigint PRIMARY KEY, balance numeric NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO business_account (account_id, balance) VALUES (1, 100)`); err != nil {
			return err
		}
		if _, err := outbox.Insert(ctx, tx, paymentEvent("1")); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("WithTx = %v, want the business error", err)
	}
	var accounts, events int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM business_account), (SELECT count(*) FROM outbox_event)`).Scan(&accounts, &events); err != nil {
		t.Fatal(err)
	}
	if accounts != 0 || events != 0 {
		t.Fatalf("after rollback: %d accounts, %d events; want neither", accounts, events)
	}

	var ins outbox.Inserted
	err = db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO business_account (account_id, balance) VALUES (2, 100)`); err != nil {
			return err
		}
		var err error
		ins, err = outbox.Insert(ctx, tx, paymentEvent("2"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	row, err := outbox.Get(ctx, pool, ins.ID)
	if err != nil {
		t.Fatalf("event after commit: %v", err)
	}
	if row.Status != outbox.StatusPending || row.AggregateID != "2" || row.AggregateSeq != 1 {
		t.Fatalf("event after commit = %+v", row)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM business_account WHERE account_id = 2`).Scan(&accounts); err != nil || accounts != 1 {
		t.Fatalf("account after commit: %d (%v)", accounts, err)
	}
	if ins.ID.Version() != 7 {
		t.Fatalf("id %s is UUID version %d, want 7", ins.ID, ins.ID.Version())
	}
}

// Concurrent writers of one aggregate get a gapless sequence, and a rolled
// back writer leaves no hole.
func TestInsertSequencePerAggregateUnderConcurrency(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	const writers = 16
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
				if _, err := outbox.Insert(ctx, tx, paymentEvent("hot")); err != nil {
					return err
				}
				if i%4 == 0 {
					return fmt.Errorf("writer %d rolls back", i)
				}
				return nil
			})
			if err != nil && i%4 != 0 {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT aggregate_seq FROM outbox_event WHERE aggregate_id = 'hot' ORDER BY aggregate_seq`)
	if err != nil {
		t.Fatal(err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if len(seqs) != writers-writers/4 {
		t.Fatalf("%d events, want %d", len(seqs), writers-writers/4)
	}
	// Rolled-back writers consumed no number that a committed one kept:
	// the counter row update rolled back with them.
	for i, s := range seqs {
		if s != int64(i+1) {
			t.Fatalf("sequences %v are not 1..%d", seqs, len(seqs))
		}
	}
}

func TestInsertRejectsInvalidEvents(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	bad := paymentEvent("x")
	bad.Payload = []byte(`{not json`)
	err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Insert(ctx, tx, bad)
		return err
	})
	if !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Fatalf("Insert(bad payload) = %v, want ErrInvalidEvent", err)
	}
}

// A producer's header may neither pass for one of the system's nor be one a
// broker cannot carry as it is: Insert refuses the event, naming the header,
// and writes nothing. Until 7 December headers were not checked: an event
// with Sluice-Replay-To was acknowledged unapplied by every other consumer,
// two with one Sluice-Event-Id were deduplicated as one, and a header name
// over 255 bytes closed the relay's RabbitMQ connection with its whole
// batch in flight.
func TestInsertRefusesHeadersTheSystemReservesOrABrokerCannotCarry(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	refused := []struct {
		name, value, says string
	}{
		{"Sluice-Replay-To", "billing", "reserved"},
		{"sluice-event-id", "order-42", "reserved"},
		{"SLUICE-AGGREGATE-SEQ", "7", "reserved"},
		{"Nats-Msg-Id", "x", "reserved"},
		{"nats-rollup", "sub", "reserved"},
		{"CC", "elsewhere", "reserved"},
		{"Bcc", "elsewhere", "reserved"},
		{"", "x", "empty"},
		{strings.Repeat("k", 256), "v", "256 bytes"},
		{"Has Space", "v", "printable ASCII"},
		{"colon:name", "v", "printable ASCII"},
		{"tab\tname", "v", "printable ASCII"},
		{"émoji", "v", "printable ASCII"},
		{"X-Line", "one\r\nNats-Rollup: all", "CR or LF"},
		{"X-Nul", "a\x00b", "NUL"},
		{"X-Bytes", "\xff\xfe", "not UTF-8"},
		{"X-Padded", " value", "space or tab"},
		{"X-Padded", "value\t", "space or tab"},
	}
	for _, c := range refused {
		ev := paymentEvent("refused")
		ev.Headers = map[string]string{"X-Fine": "ok", c.name: c.value}
		err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Insert(ctx, tx, ev)
			return err
		})
		if !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("header %.40q = %q: Insert = %v, want ErrInvalidEvent saying %q", c.name, c.value, err, c.says)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d events written (%v), want none", n, err)
	}

	ev := paymentEvent("accepted")
	ev.Headers = map[string]string{
		"traceparent":            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"X-Request-Id":           "r-1",
		"x-sluice":               "not the prefix",
		"Sluicey-Thing":          "nor this",
		"Natsy":                  "nor this",
		"Accept":                 "CC is a whole name",
		strings.Repeat("k", 255): "255 bytes",
		"Note":                   "inner  spaces,\ttabs and ünïcödé",
		"Empty":                  "",
	}
	if err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Insert(ctx, tx, ev)
		return err
	}); err != nil {
		t.Fatalf("Insert with headers the brokers carry: %v", err)
	}
}
