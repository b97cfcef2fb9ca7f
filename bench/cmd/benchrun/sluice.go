package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// The R1 data set: rows events spread round-robin over rows/eventsPerAggregate
// aggregates (event i belongs to aggregate i mod A, sequence i div A + 1), so
// an aggregate's events are A rows apart in id order, as they would be when
// many aggregates are written concurrently.
const eventsPerAggregate = 10

func aggregates(rows int) int { return max(1, rows/eventsPerAggregate) }

// payload is the ~1 KB JSON body every system carries.
var payload = func() json.RawMessage {
	pad := make([]byte, 960)
	for i := range pad {
		pad[i] = 'a' + byte(i%26)
	}
	b, _ := json.Marshal(map[string]any{"amount": "125.00", "currency": "EUR", "merchant": "m-000123", "pad": string(pad)})
	return b
}()

func migrateSluice(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := db.Migrate(ctx, pool); err != nil {
		return err
	}
	if extra := os.Getenv("BENCH_OUTBOX_SQL"); extra != "" {
		_, err := pool.Exec(ctx, extra)
		return err
	}
	return nil
}

// preloadOutbox empties the outbox and writes rows pending events with COPY
// (ids are UUIDv7 in order, as outbox.Insert would make them), then
// vacuums, analyzes and checkpoints so every run starts alike.
func preloadOutbox(ctx context.Context, pool *pgxpool.Pool, rows int) error {
	if _, err := pool.Exec(ctx, `TRUNCATE outbox_event, outbox_aggregate`); err != nil {
		return err
	}
	a := aggregates(rows)
	src := make([][]any, 0, rows)
	for i := range rows {
		id, err := uuid.NewV7()
		if err != nil {
			return err
		}
		src = append(src, []any{id, "payment", fmt.Sprintf("pay-%07d", i%a), int64(i/a + 1), "payments", "payment.requested.v1", []byte(payload), []byte(`{}`)})
	}
	if err := copyOutbox(ctx, pool, src); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO outbox_aggregate (aggregate_type, aggregate_id, last_seq)
		SELECT aggregate_type, aggregate_id, max(aggregate_seq) FROM outbox_event GROUP BY 1, 2`); err != nil {
		return err
	}
	return settle(ctx, pool, "outbox_event", "outbox_aggregate")
}

// copyOutbox loads rows (id, aggregate_type, aggregate_id, aggregate_seq,
// topic, event_type, payload, headers) with COPY, without the backlog
// counting triggers (withoutBacklogTriggers).
func copyOutbox(ctx context.Context, pool *pgxpool.Pool, src [][]any) error {
	return withoutBacklogTriggers(ctx, pool, func() error {
		if _, err := pool.CopyFrom(ctx, pgx.Identifier{"outbox_event"},
			[]string{"id", "aggregate_type", "aggregate_id", "aggregate_seq", "topic", "event_type", "payload", "headers"},
			pgx.CopyFromRows(src)); err != nil {
			return fmt.Errorf("copy outbox: %w", err)
		}
		return nil
	})
}

// withoutBacklogTriggers runs a bulk load of outbox_event with the
// product's backlog counting trigger on INSERT disabled, then recounts the
// backlog with the product's own outbox.RecountBacklog, so the counts are
// exact again before anything is measured. The trigger is statement-level
// with a transition table: on one statement loading millions of rows (D1's
// 10M) it would hold every loaded row in that table to count them. The
// bench's business only: the product never disables it (and the bench runs
// as the tables' owner, which alone may).
func withoutBacklogTriggers(ctx context.Context, pool *pgxpool.Pool, load func() error) error {
	if _, err := pool.Exec(ctx, `ALTER TABLE outbox_event DISABLE TRIGGER outbox_backlog_count_insert`); err != nil {
		return err
	}
	loadErr := load()
	if _, err := pool.Exec(ctx, `ALTER TABLE outbox_event ENABLE TRIGGER outbox_backlog_count_insert`); err != nil {
		return errors.Join(loadErr, err)
	}
	if loadErr != nil {
		return loadErr
	}
	_, _, err := outbox.RecountBacklog(ctx, pool)
	return err
}

// settle vacuums and analyzes the tables a run reads, checkpoints, and has
// the kernel write back every dirty page (sync(2)): the checkpoint syncs the
// database's files, but not the page cache the run before left behind (the
// embedded JetStream store, pgbench's or another system's load), which the
// kernel would otherwise write back 30 s later, in the middle of this run,
// with the run's WAL flushes queued behind it (P1 found that; quiesce).
func settle(ctx context.Context, pool *pgxpool.Pool, tables ...string) error {
	for _, t := range tables {
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+pgx.Identifier{t}.Sanitize()); err != nil {
			return err
		}
	}
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		return err
	}
	syscall.Sync()
	return nil
}

// runRelay drains the outbox with n outbox.Relays (the product's code).
func runRelay(ctx context.Context, pool *pgxpool.Pool, pub outbox.Publisher, rows, relays, batch int, ordered bool) (time.Duration, error) {
	var rs []*outbox.Relay
	for i := range relays {
		r, err := outbox.NewRelay(pool, pub, outbox.RelayConfig{
			Name: fmt.Sprintf("bench-%d", i), BatchSize: batch, DisableOrdering: !ordered,
			DisableListen: true, PollInterval: 5 * time.Millisecond,
		}, nil, nil)
		if err != nil {
			return 0, err
		}
		rs = append(rs, r)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	for _, r := range rs {
		wg.Go(func() { _ = r.Run(rctx) })
	}
	published := func() int64 {
		var n int64
		for _, r := range rs {
			n += r.Stats().Published
		}
		return n
	}
	err := waitFor(ctx, func() (bool, error) { return published() >= int64(rows), nil })
	el := time.Since(start)
	cancel()
	wg.Wait()
	for _, r := range rs {
		if st := r.Stats(); st.Failed > 0 || st.Lost > 0 {
			fmt.Printf("  note: %s %+v\n", r.Config().Name, st)
		}
	}
	return el, err
}

// The bare loop's statements are the relay's claim (ordered) and mark as
// they were when the benchmark was written (commit 09e153b): the loop is a
// fixed ceiling of that design, so it does not move when the relay changes.
const bareClaimSQL = `
	WITH claim AS (
		SELECT c.id, c.locked_until AS prev_lock
		  FROM outbox_event c
		 WHERE c.status = 'pending'
		   AND c.available_at <= coalesce($1::timestamptz, statement_timestamp())
		   AND (c.locked_until IS NULL OR c.locked_until < coalesce($1::timestamptz, statement_timestamp()))
		  AND NOT EXISTS (
		        SELECT 1 FROM outbox_event p
		         WHERE p.status IN ('pending', 'dead')
		           AND p.aggregate_type = c.aggregate_type
		           AND p.aggregate_id = c.aggregate_id
		           AND p.aggregate_seq < c.aggregate_seq)
		 ORDER BY c.id
		 LIMIT $2
		 FOR UPDATE OF c SKIP LOCKED
	)
	UPDATE outbox_event e
	   SET locked_until = coalesce($1::timestamptz, statement_timestamp()) + $3::bigint * interval '1 microsecond',
	       lock_token = $4,
	       attempts = e.attempts + 1
	  FROM claim
	 WHERE e.id = claim.id
	RETURNING e.id, e.aggregate_type, e.aggregate_id, e.aggregate_seq, e.topic, e.event_type,
	          e.payload, e.headers, e.attempts, claim.prev_lock IS NOT NULL`

// bareMarkSQL does not write the product's backlog count delta
// (outbox.countedUpdate): the bare loop is the SQL floor the relay is
// measured against, and nothing reads the counts of its database.
const bareMarkSQL = `
		UPDATE outbox_event
		   SET status = 'published', published_at = coalesce($3::timestamptz, statement_timestamp()), locked_until = NULL
		 WHERE id = ANY($1) AND lock_token = $2 AND status = 'pending'
		RETURNING topic`

// runBare drains the outbox with workers goroutines, each looping: claim a
// batch, publish it unless pub is nil (to JetStream: all rows sent
// asynchronously, one wait for the acks), mark.
func runBare(ctx context.Context, pool *pgxpool.Pool, pub broker.Publisher, rows, workers, batch int) (time.Duration, error) {
	var marked atomic.Int64
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for rctx.Err() == nil {
				n, err := bareOnce(rctx, pool, pub, batch)
				if err != nil {
					if rctx.Err() == nil {
						errc <- err
					}
					return
				}
				marked.Add(int64(n))
				if n == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	err := waitFor(ctx, func() (bool, error) {
		select {
		case err := <-errc:
			return false, err
		default:
		}
		return marked.Load() >= int64(rows), nil
	})
	el := time.Since(start)
	cancel()
	wg.Wait()
	return el, err
}

func bareOnce(ctx context.Context, pool *pgxpool.Pool, pub broker.Publisher, batch int) (int, error) {
	token := uuid.New()
	rows, err := pool.Query(ctx, bareClaimSQL, nil, batch, (30 * time.Second).Microseconds(), token)
	if err != nil {
		return 0, err
	}
	var msgs []broker.Message
	var ids []uuid.UUID
	for rows.Next() {
		var (
			id       uuid.UUID
			m        broker.Message
			headers  []byte
			attempts int
			leased   bool
		)
		if err := rows.Scan(&id, &m.AggregateType, &m.AggregateID, &m.AggregateSeq, &m.Topic, &m.EventType, &m.Payload, &headers, &attempts, &leased); err != nil {
			rows.Close()
			return 0, err
		}
		m.ID = id.String()
		msgs = append(msgs, m)
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	switch pub := pub.(type) {
	case nil:
	case *natsSink:
		if err := pub.publishBatch(ctx, msgs); err != nil {
			return 0, err
		}
	case *rabbitSink:
		// The batch in flight at once, then the confirms: the adapter's
		// PublishBatch is that, with nothing of the relay around it.
		for _, err := range pub.PublishBatch(ctx, msgs) {
			if err != nil {
				return 0, err
			}
		}
	default:
		for _, m := range msgs {
			if err := pub.Publish(ctx, m); err != nil {
				return 0, err
			}
		}
	}
	tag, err := pool.Exec(ctx, bareMarkSQL, ids, token, nil)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// waitFor polls done every 2 ms until it reports true or an error.
func waitFor(ctx context.Context, done func() (bool, error)) error {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
