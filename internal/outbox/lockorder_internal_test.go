package outbox

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// insertLeasedShuffled writes n pending events leased to token, in an order
// unrelated to their ids, so that the table's physical order is not id
// order: a statement that locks rows as a scan of the heap meets them (a
// sequential or bitmap scan) locks them out of id order. It returns the ids
// in id order, with the table analyzed.
func insertLeasedShuffled(t *testing.T, pool *pgxpool.Pool, n int, token uuid.UUID) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7())
	}
	shuffled := slices.Clone(ids)
	rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, lock_token, locked_until)
		SELECT id, 'order', 'a' || k, 1, 't', 'order.v1', '{}', $2, now() + interval '1 hour'
		  FROM unnest($1::uuid[]) WITH ORDINALITY AS x (id, k)
		 ORDER BY k`, shuffled, token); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE outbox_event`); err != nil {
		t.Fatal(err)
	}
	return ids
}

// lockedWhileWaiting runs write, which must block on the row lock held on
// ids[held] by another transaction, and returns which of ids the write had
// locked by then. It then lets the write finish and returns its error.
//
// Every statement that locks several outbox rows must lock them in id order:
// a bulk job's chunk locks its rows that way (job.go), so a statement that
// locks the same rows in another order can deadlock with it (each waits for
// a row the other holds; PostgreSQL cancels one after deadlock_timeout). So
// when the write waits on ids[held], it must hold every id below and none
// above.
func lockedWhileWaiting(t *testing.T, pool *pgxpool.Pool, ids []uuid.UUID, held int, write func(context.Context) error) (locked []bool, err error) {
	t.Helper()
	ctx := context.Background()
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck
	if _, err := holder.Exec(ctx, `SELECT 1 FROM outbox_event WHERE id = $1 FOR UPDATE`, ids[held]); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- write(ctx) }()
	testkit.Eventually(t, "the write waits for the held row", func() (bool, error) {
		select {
		case err := <-done:
			t.Fatalf("the write finished without waiting for the held row (err %v)", err)
		default:
		}
		var waiting int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%UPDATE outbox_event%'`).Scan(&waiting)
		return waiting == 1, err
	})
	// The rows nobody holds are the ones a SKIP LOCKED read returns.
	var free []uuid.UUID
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id FROM outbox_event WHERE id = ANY($1) FOR UPDATE SKIP LOCKED`, ids)
		if err != nil {
			return err
		}
		free, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			return err
		}
		return errors.New("rollback") // a probe: lock nothing
	})
	if err == nil || err.Error() != "rollback" {
		t.Fatal(err)
	}
	locked = make([]bool, len(ids))
	for i, id := range ids {
		locked[i] = !slices.Contains(free, id)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the write did not finish once the held row was free")
	}
	return locked, err
}

// checkIDOrder fails unless locked holds exactly the ids below held, and
// held itself (the other transaction's).
func checkIDOrder(t *testing.T, what string, locked []bool, held int) {
	t.Helper()
	var wrong []int
	for i, l := range locked {
		if l != (i <= held) {
			wrong = append(wrong, i)
		}
	}
	if len(wrong) > 0 {
		t.Fatalf("%s locked its rows out of id order: waiting on the row at %d of %d, %d rows were locked "+
			"that should not be, or free that should be locked (first at %d); a bulk job's chunk, which locks in id "+
			"order, can deadlock with it", what, held, len(locked), len(wrong), wrong[0])
	}
}

// The relay's mark and release lock a batch of rows by their ids; they must
// lock them in id order, as a bulk job's chunk does, whatever plan the
// server picks for the batch (with the heap out of id order, a bitmap or
// sequential scan locks them in the heap's order: three deadlocks between a
// mark and a chunk were in the server's log of the tests' runs, 6 December).
func TestMarkAndReleaseLockInIDOrder(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	token := uuid.New()
	ids := insertLeasedShuffled(t, pool, 4000, token)
	r, err := NewRelay(pool, unusedPublisher{t}, RelayConfig{Name: "order", BatchSize: 500, DisableListen: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	batch := func(ids []uuid.UUID) []claimed {
		evs := make([]claimed, len(ids))
		for i, id := range ids {
			evs[i] = claimed{ID: id, Topic: "t"}
		}
		return evs
	}
	// A release of 500, a mark of them, a mark of the next 500: twice, the
	// second time with the marks' batches listed backwards.
	ctx := context.Background()
	for round := range 2 {
		relIDs := ids[round*1000 : round*1000+500]
		locked, err := lockedWhileWaiting(t, pool, relIDs, 250, func(ctx context.Context) error {
			return r.release(ctx, batch(relIDs), token, 0, "")
		})
		if err != nil {
			t.Fatal(err)
		}
		checkIDOrder(t, "the release", locked, 250)
		// Released: leased to token again for the mark.
		if _, err := pool.Exec(ctx, `UPDATE outbox_event SET lock_token = $2, locked_until = now() + interval '1 hour' WHERE id = ANY($1)`, relIDs, token); err != nil {
			t.Fatal(err)
		}
		for _, markIDs := range [][]uuid.UUID{relIDs, ids[round*1000+500 : round*1000+1000]} {
			evs := batch(markIDs)
			if round == 1 {
				slices.Reverse(evs)
			}
			var n int
			locked, err := lockedWhileWaiting(t, pool, markIDs, 100, func(ctx context.Context) (err error) {
				n, err = r.markPublished(ctx, evs, token)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			checkIDOrder(t, "the mark", locked, 100)
			if n != len(markIDs) {
				t.Fatalf("marked %d of %d", n, len(markIDs))
			}
		}
	}
}
