package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// D1's churn phase: the snapshot on an outbox whose events were published
// since the last vacuum, as a busy outbox's are between two of autovacuum's
// visits (on a large table, rare: 20 % of its rows must be dead first). A
// published event's entry stays in the pending partial indexes until VACUUM,
// and a walk of a topic's head from its lowest id passes over each one. At
// the head of the topic: a dead letter and an event of its aggregate held
// behind it, pending for as long as no operator acts, so the topic's first
// pending event stays below the whole history. The snapshot is read as the
// console's feed reads it, with its cursor (outbox.BacklogCursor), against
// the same statement without one (what every tick read before the cursor),
// interleaved.

// d1ChurnPublished is how many events of the topic are published since the
// last vacuum (quick, full). They were published an hour ago (published_at):
// the snapshot's count of events published since the previous tick is not
// what this phase measures.
var d1ChurnPublished = [2]int{200000, 1000000}

func d1Churn(ctx context.Context, e *workloadEnv, reps int) error {
	published := e.size(d1ChurnPublished[1], d1ChurnPublished[0])
	if e.o.d1Churn > 0 {
		published = e.o.d1Churn
	}
	pool, err := e.newDB("d1_churn")
	if err != nil {
		return err
	}
	defer pool.Close()
	t0 := time.Now()
	if err := d1ChurnLoad(ctx, pool, published); err != nil {
		return fmt.Errorf("d1 churn: load: %w", err)
	}
	fmt.Printf("  churn: %d events published since the last vacuum behind a held event, 10 pending, in %.0fs\n", published, time.Since(t0).Seconds())
	var cursor outbox.BacklogCursor
	reads := []struct {
		name string
		cur  *outbox.BacklogCursor
	}{{"without a cursor", nil}, {"with the feed's cursor", &cursor}}
	recs := make([]*recorder, len(reads))
	for i, r := range reads {
		// Warm-ups: the first walk marks the published entries dead in the
		// index; the last one's statement is explained below (the cursor's
		// state in its arguments).
		for k := range 3 {
			var q live.Querier = pool
			if k == 2 {
				recs[i] = &recorder{q: pool}
				q = recs[i]
			}
			if _, err := live.ReadSnapshot(ctx, q, time.Now().Add(-time.Second), r.cur); err != nil {
				return err
			}
		}
	}
	lats := make([][]float64, len(reads))
	for range reps {
		for i, r := range reads {
			t := time.Now()
			if _, err := live.ReadSnapshot(ctx, pool, time.Now().Add(-time.Second), r.cur); err != nil {
				return err
			}
			lats[i] = append(lats[i], ms(time.Since(t)))
		}
	}
	rows := fmt.Sprintf("%dk published since the last vacuum", published/1000)
	var res []*wlResult
	for i, r := range reads {
		lat := lats[i]
		slices.Sort(lat)
		res = append(res, &wlResult{Workload: "D1", Metric: fmt.Sprintf("snapshot p99 %s, %s (p50 %s ms)", r.name, rows, fmtVal(pct(lat, 50))),
			System: "console", Config: fmt.Sprintf("%d reps", reps), Unit: "ms", Runs: []float64{pct(lat, 99)},
			Details: map[string]any{"p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "max_ms": lat[len(lat)-1], "published": published}})
	}
	for i, r := range reads {
		for _, st := range recs[i].stmts {
			plan, err := explainRecorded(ctx, pool, st)
			if err != nil {
				return fmt.Errorf("d1 churn: explain: %w", err)
			}
			e.plan("D1", "snapshot "+r.name+", "+rows, plan)
		}
	}
	e.add(res[0])
	e.add(res[1]).against(res[0])
	res[1].Baseline = "the same read without a cursor"
	res[1].goal("p99 ≤ 10 ms", res[1].Median <= 10)
	e.note("d1", "churn: %d events of one topic inserted and marked published in batches of 5,000 (as relays mark them) with autovacuum off on outbox_event (a large table's autovacuum comes after 20 %% of its rows are dead), behind a dead letter and an event of its aggregate held behind it; 10 new pending events; the snapshot read %d times after 3 warm-ups, without a cursor and with the feed's (outbox.BacklogCursor), interleaved", published, reps)
	return nil
}

func d1ChurnLoad(ctx context.Context, pool *pgxpool.Pool, published int) error {
	if err := migrateSluice(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE outbox_event SET (autovacuum_enabled = false)`); err != nil {
		return err
	}
	start := time.Now().Add(-time.Hour)
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, dead_at, dead_reason, created_at)
		VALUES ($1, 'account', 'held', 1, 'accounts', 'account.changed.v1', '{}', 'dead', now(), 'refused: bench', now() - interval '2 hours'),
		       ($2, 'account', 'held', 2, 'accounts', 'account.changed.v1', '{}', 'pending', NULL, NULL, now() - interval '2 hours')`,
		d1V7(start.Add(-time.Hour), 1), d1V7(start.Add(-time.Hour), 2)); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, created_at)
		SELECT (lpad(to_hex($1::bigint + g / 100), 12, '0') || '7000' || '8000' || lpad(to_hex(g), 12, '0'))::uuid,
		       'account', 'a' || g, 1, 'accounts', 'account.changed.v1', '{"n": 1}', to_timestamp(($1::bigint + g / 100) / 1000.0)
		  FROM generate_series(1, $2::bigint) g`, start.UnixMilli(), published); err != nil {
		return err
	}
	for {
		tag, err := pool.Exec(ctx, `
			UPDATE outbox_event SET status = 'published', published_at = created_at + interval '50 ms', locked_until = NULL
			 WHERE id IN (SELECT id FROM outbox_event WHERE status = 'pending' AND aggregate_id <> 'held' ORDER BY id LIMIT 5000)`)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			break
		}
	}
	for range 10 {
		if _, err := pool.Exec(ctx, `
			INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload)
			VALUES ($1, 'account', $2, 1, 'accounts', 'account.changed.v1', '{"n": 1}')`, uuid.Must(uuid.NewV7()), uuid.NewString()); err != nil {
			return err
		}
	}
	_, _, err := outbox.RecountBacklog(ctx, pool)
	return err
}

// d1V7 is the n-th UUIDv7 of the millisecond at.
func d1V7(at time.Time, n int) uuid.UUID {
	h := fmt.Sprintf("%012x", at.UnixMilli())
	return uuid.MustParse(fmt.Sprintf("%s-%s-7000-8000-%012x", h[:8], h[8:], n))
}
