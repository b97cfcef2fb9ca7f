package outbox_test

import (
	"context"
	"errors"
	"fmt"
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
