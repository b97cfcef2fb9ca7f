package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// Pruning runs flat out, with a zero retention, while three relays drain
// the outbox and some publishes fail and back off: it may only ever take
// rows the relays already published. Every event reaches the broker, the
// dead letters stay, and what pruning deleted plus what is left is exactly
// what was written.
func TestPruneUnderConcurrentRelays(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	events := bulkInsert(t, pool, "pr", 200, 15)
	// A few dead letters an operator has not looked at yet (each the last
	// event of its aggregate, so they hold nothing back).
	var deadIDs []uuid.UUID
	for _, e := range events[len(events)-20:] {
		deadIDs = append(deadIDs, e.ID)
		if _, err := outbox.DeadLetter(ctx, pool, e.ID, outbox.StatusPending, "parked by the test"); err != nil {
			t.Fatalf("dead-letter: %v", err)
		}
	}

	log := &pubLog{}
	var relays []*outbox.Relay
	for i := range 3 {
		pub := &memPublisher{name: fmt.Sprintf("r%d", i), log: log, before: func(_ context.Context, m broker.Message) error {
			h := fnv.New32a()
			h.Write([]byte(m.ID))
			if h.Sum32()%7 == 0 && time.Now().UnixNano()%2 == 0 {
				return errors.New("broker hiccup")
			}
			return nil
		}}
		r, err := outbox.NewRelay(pool, pub, outbox.RelayConfig{
			Name: pub.name, BatchSize: 50, PollInterval: 10 * time.Millisecond, DisableListen: true,
			MaxAttempts: 1000, Backoff: outbox.Backoff{Base: time.Millisecond, Cap: 5 * time.Millisecond},
		}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		relays = append(relays, r)
	}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, r := range relays {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Run(runCtx); err != nil {
				t.Error(err)
			}
		}()
	}
	var pruned atomic.Int64
	var passes atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for runCtx.Err() == nil {
			// Not runCtx: a statement cancelled mid-flight may still have
			// committed, and its rows would go uncounted.
			n, err := outbox.Prune(ctx, pool, 0, 100, time.Now().Add(time.Hour))
			if err != nil {
				t.Errorf("prune: %v", err)
				return
			}
			pruned.Add(n)
			passes.Add(1)
		}
	}()
	testkit.Until(t, "the relays to drain while pruning runs", func() bool {
		var pending int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE status = 'pending'`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		return pending == 0 && pruned.Load() > 0
	})
	stop()
	wg.Wait()
	// One last pass after the relays stopped.
	n, err := outbox.Prune(ctx, pool, 0, 100, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	pruned.Add(n)

	got := map[string]bool{}
	for _, p := range log.all() {
		got[p.Msg.ID] = true
	}
	dead := map[uuid.UUID]bool{}
	for _, id := range deadIDs {
		dead[id] = true
	}
	for _, e := range events {
		if !dead[e.ID] && !got[e.ID.String()] {
			t.Fatalf("event %s (%s #%d) never reached the broker: pruned before it was published?", e.ID, e.Agg, e.Seq)
		}
	}
	c := statusCounts(t, pool)
	if c[outbox.StatusDead] != len(deadIDs) || c[outbox.StatusPending] != 0 || c[outbox.StatusPublished] != 0 {
		t.Fatalf("left after pruning: %v, want only the %d dead letters", c, len(deadIDs))
	}
	if int(pruned.Load()) != len(events)-len(deadIDs) {
		t.Fatalf("pruning deleted %d rows, want the %d published ones", pruned.Load(), len(events)-len(deadIDs))
	}
	var failed int64
	for _, r := range relays {
		failed += r.Stats().Failed
	}
	t.Logf("%d prune passes, %d failed publishes retried", passes.Load(), failed)
}

// Prune takes its rows in id order, as every other locker of outbox rows
// does (a bulk job's chunk, an operator's action), so it never closes a
// cycle with one of them. A replay job's chunk holds the lowest id of the
// table and then locks the rest in id order while a prune runs, on events
// whose published_at runs against their ids (replayed events are published
// again long after their ids were made). Locking in published_at order, prune
// took some of those rows and waited for the lowest one; the chunk then waited
// for prune's, and PostgreSQL aborted one of the two.
func TestPruneTakesItsRowsInIDOrder(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 50
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, published_at)
		SELECT ('01000000-0000-7000-8000-' || lpad(g::text, 12, '0'))::uuid, 'prune', 'p' || g, 1, 'prune', 'prune.v1', '{}'::jsonb,
		       'published', now() - interval '1 hour' - g * interval '1 minute'
		  FROM generate_series(1, $1) g`, n); err != nil {
		t.Fatal(err)
	}
	// The chunk holds the lowest id first.
	chunk, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer chunk.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	var lowest uuid.UUID
	if err := chunk.QueryRow(ctx, `SELECT id FROM outbox_event ORDER BY id LIMIT 1 FOR UPDATE`).Scan(&lowest); err != nil {
		t.Fatal(err)
	}
	type result struct {
		n   int64
		err error
	}
	pruned := make(chan result, 1)
	go func() {
		n, err := outbox.Prune(ctx, pool, time.Minute, 100, time.Now())
		pruned <- result{n, err}
	}()
	testkit.Until(t, "prune to wait for the chunk's row", func() bool {
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%DELETE FROM outbox_event%')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting
	})
	// The chunk takes the rest in id order, as a job's chunk does, and
	// replays them.
	rows, err := chunk.Query(ctx, `SELECT id FROM outbox_event ORDER BY id FOR UPDATE`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatalf("the chunk could not lock the rows prune was deleting: %v (prune and the chunk locked them in different orders)", err)
	}
	if _, err := chunk.Exec(ctx, `UPDATE outbox_event SET status = 'pending', published_at = NULL WHERE id = ANY($1) AND id <> $2`, ids[len(ids)/2:], lowest); err != nil {
		t.Fatalf("replay: %v", err)
	}
	if err := chunk.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-pruned
	if r.err != nil {
		t.Fatalf("prune: %v", r.err)
	}
	// The replayed half is pending again: prune re-checks each row it waited
	// for and leaves those.
	c := statusCounts(t, pool)
	if want := int64(n - n/2); r.n != want || c[outbox.StatusPending] != n/2 || c[outbox.StatusPublished] != 0 {
		t.Fatalf("prune deleted %d rows and left %v; want %d deleted and the %d replayed events pending", r.n, c, want, n/2)
	}
}
