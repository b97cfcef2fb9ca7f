package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/testkit"
)

var countTopics = []string{"count.a", "count.b", "count.c"}

// exactCounts counts the pending and dead events per topic the slow way,
// "topic/status" → n.
func exactCounts(t *testing.T, pool *pgxpool.Pool) map[string]int64 {
	t.Helper()
	rows, _ := pool.Query(context.Background(), `SELECT topic || '/' || status, count(*) FROM outbox_event
		WHERE status IN ('pending', 'dead') GROUP BY topic, status`)
	return collectCounts(t, rows)
}

// keptCounts sums the backlog count deltas, "topic/status" → n (zero
// counts left out, as exactCounts has no row for them).
func keptCounts(t *testing.T, pool *pgxpool.Pool) map[string]int64 {
	t.Helper()
	rows, _ := pool.Query(context.Background(), `SELECT topic || '/' || status, sum(n)::bigint FROM outbox_backlog_count
		GROUP BY topic, status HAVING sum(n) <> 0`)
	return collectCounts(t, rows)
}

func collectCounts(t *testing.T, rows pgx.Rows) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for rows.Next() {
		var k string
		var n int64
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		out[k] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func assertCountsExact(t *testing.T, pool *pgxpool.Pool, when string) {
	t.Helper()
	want, got := exactCounts(t, pool), keptCounts(t, pool)
	if !maps.Equal(want, got) {
		t.Fatalf("%s: backlog counts %v, exact counts %v", when, got, want)
	}
	b, err := outbox.ReadBacklog(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	var pending, dead int64
	for k, n := range want {
		if strings.HasSuffix(k, "/pending") {
			pending += n
		} else {
			dead += n
		}
	}
	if b.Pending != pending || b.Dead != dead {
		t.Fatalf("%s: ReadBacklog says %d pending, %d dead; exact %d, %d", when, b.Pending, b.Dead, pending, dead)
	}
}

// expected reports the errors an operator meets when someone else acted
// first: they change nothing.
func expected(err error) bool {
	return err == nil || errors.Is(err, outbox.ErrConflict) || errors.Is(err, outbox.ErrNotFound)
}

// Issue 12, goal 6: the counts kept on write equal an exact count after a
// random concurrent mix of everything that writes outbox_event: producers
// (single and multi-row statements, several topics), relays whose broker
// refuses some events until they die, operator retry / discard /
// dead-letter, bulk jobs (retry, discard, replay), prune, raw DELETE,
// TRUNCATE, and compactions and recounts running all along.
func TestBacklogCountsStayExactUnderAConcurrentMix(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	// A deadlock between writers that lock rows in different orders (the
	// product's lock in id order; the raw deletes and updates here do not)
	// aborts one transaction whole, as it would in production: expected
	// here, and its deltas must vanish with it.
	fail := func(what string, err error) {
		if err != nil && ctx.Err() == nil && !db.IsRetryable(err) {
			t.Errorf("%s: %v", what, err)
		}
	}
	loop := func(what string, pause time.Duration, step func(r *rand.Rand) error) {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(rand.Uint64(), 0))
			for ctx.Err() == nil {
				fail(what, step(r))
				time.Sleep(time.Duration(r.Int64N(int64(pause) + 1)))
			}
		})
	}

	// Producers: Insert (one row per statement) and raw multi-row INSERTs,
	// some of them already dead (as a producer in another language might).
	for p := range 3 {
		loop("insert", 2*time.Millisecond, func(r *rand.Rand) error {
			topic := countTopics[r.IntN(len(countTopics))]
			return db.WithTx(ctx, pool, func(tx pgx.Tx) error {
				for range 1 + r.IntN(3) {
					if _, err := outbox.Insert(ctx, tx, outbox.Event{AggregateType: "count", AggregateID: fmt.Sprintf("p%d-%d", p, r.IntN(50)),
						Topic: topic, EventType: "count.v1", Payload: []byte(`{}`)}); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
	loop("multi-row insert", 5*time.Millisecond, func(r *rand.Rand) error {
		_, err := pool.Exec(ctx, `
			INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, dead_at)
			SELECT gen_random_uuid(), 'raw', gen_random_uuid()::text, 1, ($1::text[])[1 + g % 3], 'raw.v1', '{}',

			       CASE WHEN g % 5 = 0 THEN 'dead' ELSE 'pending' END, CASE WHEN g % 5 = 0 THEN now() END
			  FROM generate_series(1, $2) g`, countTopics, 1+r.IntN(20))
		return err
	})

	// Relays: the broker refuses about one event in eight, every time, so
	// those die after their attempts.
	refuse := func(_ context.Context, m broker.Message) error {
		if m.ID[len(m.ID)-1] < '2' {
			return errors.New("refused")
		}
		return nil
	}
	var relays []*outbox.Relay
	for i := range 2 {
		relay, err := outbox.NewRelay(pool, &memPublisher{name: "r", log: &pubLog{}, before: refuse},
			outbox.RelayConfig{Name: fmt.Sprint("r", i), BatchSize: 20, MaxAttempts: 2, DisableListen: true,
				PollInterval: 5 * time.Millisecond, Backoff: outbox.Backoff{Base: time.Millisecond, Cap: time.Millisecond}}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		relays = append(relays, relay)
		wg.Go(func() { _ = relay.Run(ctx) })
	}

	// Operators, one event at a time, on whatever they find.
	pick := func(status string) (uuid.UUID, bool) {
		var id uuid.UUID
		err := pool.QueryRow(ctx, `SELECT id FROM outbox_event WHERE status = $1 ORDER BY random() LIMIT 1`, status).Scan(&id)
		return id, err == nil
	}
	loop("operator", 3*time.Millisecond, func(r *rand.Rand) error {
		var err error
		switch r.IntN(3) {
		case 0:
			if id, ok := pick(outbox.StatusDead); ok {
				_, err = outbox.Retry(ctx, pool, id, outbox.StatusDead)
			}
		case 1:
			if id, ok := pick(outbox.StatusDead); ok {
				_, err = outbox.Discard(ctx, pool, id, outbox.StatusDead, "test")
			}
		case 2:
			if id, ok := pick(outbox.StatusPending); ok {
				_, err = outbox.DeadLetter(ctx, pool, id, outbox.StatusPending, "test")
			}
		}
		if expected(err) {
			return nil
		}
		return err
	})

	// Bulk jobs: retry, discard, dead-letter and replay of a topic.
	runner, err := outbox.NewJobRunner(pool, outbox.JobRunnerConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	loop("bulk job", 20*time.Millisecond, func(r *rand.Rand) error {
		req := outbox.JobRequest{Kind: []string{outbox.JobRetry, outbox.JobDiscard, outbox.JobDeadLetter, outbox.JobReplay}[r.IntN(4)],
			Filter: outbox.Filter{Topic: countTopics[r.IntN(len(countTopics))]}, Reason: "test", RequestedBy: "op", ChunkSize: 10}
		if _, err := db.WithTxV(ctx, pool, func(tx pgx.Tx) (outbox.Job, error) { return outbox.CreateJob(ctx, tx, req) }); err != nil {
			return err
		}
		for {
			ran, err := runner.RunOnce(ctx)
			if err != nil || !ran {
				return err
			}
		}
	})

	// Prune, raw deletes of any status, and now and then a TRUNCATE.
	loop("prune", 10*time.Millisecond, func(*rand.Rand) error {
		_, err := outbox.Prune(ctx, pool, 0, 50, time.Now())
		return err
	})
	loop("raw delete", 10*time.Millisecond, func(r *rand.Rand) error {
		_, err := pool.Exec(ctx, `DELETE FROM outbox_event WHERE id IN (
			SELECT id FROM outbox_event WHERE status = $1 LIMIT $2 FOR UPDATE SKIP LOCKED)`,
			[]string{"pending", "dead", "published", "discarded"}[r.IntN(4)], 1+r.IntN(10))
		return err
	})
	var truncates, compacted atomic.Int64
	loop("truncate", 400*time.Millisecond, func(*rand.Rand) error {
		_, err := pool.Exec(ctx, `TRUNCATE outbox_event`)
		if err == nil {
			truncates.Add(1)
		}
		return err
	})

	// Compactions, several at once, and a recount now and then.
	for range 3 {
		loop("compact", time.Millisecond, func(*rand.Rand) error {
			n, err := outbox.CompactBacklogCounts(ctx, pool)
			compacted.Add(n)
			return err
		})
	}
	loop("recount", 200*time.Millisecond, func(*rand.Rand) error {
		_, _, err := outbox.RecountBacklog(ctx, pool)
		return err
	})

	// Four seconds of the mix, longer while it has not yet published, killed
	// an event, truncated and compacted (a loaded machine runs it slowly:
	// one CI run had published 58 events and killed none in four seconds),
	// at most 90 s.
	proved := func() bool {
		var published, died int64
		for _, r := range relays {
			published, died = published+r.Stats().Published, died+r.Stats().Dead
		}
		return published > 0 && died > 0 && truncates.Load() > 0 && compacted.Load() > 0
	}
	time.Sleep(4 * time.Second)
	for deadline := time.Now().Add(86 * time.Second); !proved() && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	if t.Failed() {
		return
	}
	bg := context.Background()
	// A statement the cancel interrupted can still be running on the server
	// after its goroutine returned (pgx cancels and drops the connection; the
	// backend notices later): a recount still holding backlogCountLock makes
	// the final compaction below do nothing, as it must. The checks start
	// when no other session of this database runs a statement or holds a
	// lock.
	testkit.Eventually(t, "the mix's statements ended on the server", func() (bool, error) {
		var busy int
		err := pool.QueryRow(bg, `
			SELECT count(*) FROM pg_stat_activity
			 WHERE datname = current_database() AND pid <> pg_backend_pid() AND state IS DISTINCT FROM 'idle'
			   AND backend_type = 'client backend'`).Scan(&busy)
		if err == nil && busy == 0 {
			err = pool.QueryRow(bg, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&busy)
		}
		return err == nil && busy == 0, err
	})
	var published, died int64
	for _, r := range relays {
		published, died = published+r.Stats().Published, died+r.Stats().Dead
	}
	if published == 0 || died == 0 || truncates.Load() == 0 || compacted.Load() == 0 {
		t.Fatalf("the mix proved little: %d published, %d died, %d truncates, %d delta rows compacted",
			published, died, truncates.Load(), compacted.Load())
	}
	assertCountsExact(t, pool, "after the mix")
	// Whatever the mix left (a TRUNCATE may have come last), the counts go
	// on from there.
	if _, err := pool.Exec(bg, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, dead_at)
		SELECT gen_random_uuid(), 'end', gen_random_uuid()::text, 1, 'count.a', 'end.v1', '{}',
		       CASE WHEN g % 3 = 0 THEN 'dead' ELSE 'pending' END, CASE WHEN g % 3 = 0 THEN now() END
		  FROM generate_series(1, 30) g`); err != nil {
		t.Fatal(err)
	}
	assertCountsExact(t, pool, "after the mix and 30 more events")
	if _, err := outbox.CompactBacklogCounts(bg, pool); err != nil {
		t.Fatal(err)
	}
	assertCountsExact(t, pool, "after a final compaction")
	assertOneRowPerCount(t, pool, "after a final compaction")
	if n, err := outbox.CompactBacklogCounts(bg, pool); err != nil || n != 0 {
		t.Fatalf("a compaction of compacted counts removed %d rows (%v)", n, err)
	}
}

// Two compactions never wait for each other: the second does nothing while
// the first is under way. Until 6 December they ran together, each deleting
// the whole table, so the second waited on the first's deleted rows, and two
// relays' compactions deadlocked once the table outgrew a quarter of
// shared_buffers (synchronized sequential scans start the second scan
// mid-table): bench R2 saw both relays stall for deadlock_timeout. Here the
// first compaction is left uncommitted, and the second runs under a
// lock_timeout: it fails if it waits for any lock at all.
func TestCompactionsDoNotWaitForEachOther(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	for i := range 3 { // three insert statements: three delta rows of one count
		bulkInsert(t, pool, fmt.Sprintf("cw%d", i), 5, 1)
	}
	var before int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_backlog_count`).Scan(&before); err != nil || before < 3 {
		t.Fatalf("%d delta rows to compact (%v), want 3 or more", before, err)
	}

	first, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	if n, err := outbox.CompactBacklogCounts(ctx, first); err != nil || n < 2 {
		t.Fatalf("the first compaction removed %d rows (%v), want at least 2", n, err)
	}

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET lock_timeout = '5s'`); err != nil {
		t.Fatal(err)
	}
	n, err := outbox.CompactBacklogCounts(ctx, conn)
	if _, resetErr := conn.Exec(ctx, `RESET lock_timeout`); resetErr != nil {
		t.Fatal(resetErr)
	}
	if err != nil {
		t.Fatalf("a compaction beside one under way: %v (it waited for the other's locks)", err)
	}
	if n != 0 {
		t.Fatalf("a compaction beside one under way removed %d rows, want none", n)
	}

	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	assertCountsExact(t, pool, "after both compactions")
	assertOneRowPerCount(t, pool, "after both compactions")
}

// assertOneRowPerCount checks the deltas are compacted: one row per (topic,
// status).
func assertOneRowPerCount(t *testing.T, pool *pgxpool.Pool, when string) {
	t.Helper()
	var rows, keys int
	if err := pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT (topic, status)) FROM outbox_backlog_count`).Scan(&rows, &keys); err != nil {
		t.Fatal(err)
	}
	if rows != keys {
		t.Fatalf("%s: %d delta rows for %d counts, want one each", when, rows, keys)
	}
}

// A recount repairs counts a hand-written status change left wrong.
func TestRecountRepairsAStatusChangedByHand(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	bulkInsert(t, pool, "rc", 10, 1)
	if _, err := pool.Exec(ctx, `UPDATE outbox_event SET status = 'dead', dead_at = now() WHERE aggregate_id IN ('rc-1', 'rc-2')`); err != nil {
		t.Fatal(err)
	}
	if got := keptCounts(t, pool); got["test.topic/pending"] != 10 {
		t.Fatalf("counts %v: the hand-written UPDATE was counted after all", got)
	}
	pending, dead, err := outbox.RecountBacklog(ctx, pool)
	if err != nil || pending != 8 || dead != 2 {
		t.Fatalf("recount: %d pending, %d dead (%v), want 8 and 2", pending, dead, err)
	}
	assertCountsExact(t, pool, "after the recount")
}
