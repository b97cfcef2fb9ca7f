package outbox

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/outbox/outboxtest"
)

// relaySettings puts tx under the settings the relay's floor read and claim
// run with (claimPlanSQL): generic plans, no sequential scans or sorts.
func relaySettings(t *testing.T, tx pgx.Tx) {
	t.Helper()
	if _, err := tx.Exec(context.Background(), claimPlanSQL); err != nil {
		t.Fatal(err)
	}
}

// claimPlan is the generic plan (EXPLAIN) of claimSQL(ordered) under the
// relay's settings, as the relay runs it (a prepared statement), for a walk
// from from with no topic paused.
func claimPlan(t *testing.T, tx pgx.Tx, ordered bool, from string) string {
	t.Helper()
	relaySettings(t, tx)
	if _, err := tx.Exec(context.Background(), "PREPARE claim_generic (timestamptz, bigint, bigint, uuid, uuid, text[]) AS "+claimSQL(ordered)); err != nil {
		t.Fatal(err)
	}
	plan := planText(t, tx, fmt.Sprintf(`EXPLAIN EXECUTE claim_generic (NULL, %d, 30000000, '00000000-0000-0000-0000-000000000001', '%s', '{}')`,
		DefaultBatchSize, from))
	// A prepared statement outlives the transaction: the next check on
	// this connection prepares its own.
	if _, err := tx.Exec(context.Background(), "DEALLOCATE claim_generic"); err != nil {
		t.Fatal(err)
	}
	return plan
}

// The claim must read the partial index of pending rows in its own order, so
// a batch costs about the rows it takes, however much history the table has.
func TestClaimPlanUsesThePendingIndex(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	// 50,000 published rows of history and 2,000 pending, their ids in
	// insert order as outbox.Insert makes them (UUIDv7). With random ids the
	// pending rows' id order had nothing to do with where they lie, and once
	// (a loaded machine, the same test passing 60 times alone) the planner
	// costed a bitmap scan and a sort of all 2,000 below the walk: a plan for
	// data the product never writes.
	_, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, published_at)
		SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, 'plan', 'a' || (g % 1000), g, 't', 'plan.v1', '{}'::jsonb,
		       CASE WHEN g <= 50000 THEN 'published' ELSE 'pending' END,
		       CASE WHEN g <= 50000 THEN now() END
		  FROM generate_series(1, 52000) g`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE outbox_event`); err != nil {
		t.Fatal(err)
	}
	type variant struct {
		ordered bool
		from    string // where the walk starts ($5)
	}
	// The relay runs the claim on its prepared statement's generic plan
	// (claimPlanSQL). The walk starts at the zero id, or at a relay's
	// cursor: the first pending id.
	const zero, cursor = "00000000-0000-0000-0000-000000000000", "00000000-0000-7000-8000-00000000c351"
	for _, v := range []variant{{true, zero}, {false, zero}, {true, cursor}, {false, cursor}} {
		ordered := v.ordered
		text := func() string {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			return claimPlan(t, tx, ordered, v.from)
		}()
		t.Logf("claim plan (ordered=%v, from %s):\n%s", ordered, v.from, text)
		if !strings.Contains(text, "Index Scan using outbox_event_pending_idx") || !strings.Contains(text, "Index Cond: (id >= $5)") {
			t.Fatalf("ordered=%v: the claim does not walk outbox_event_pending_idx:\n%s", ordered, text)
		}
		if strings.Contains(text, "Sort") || strings.Contains(text, "Seq Scan") || strings.Contains(text, "Join") {
			t.Fatalf("ordered=%v: the claim sorts or scans the table, or joins its rows back:\n%s", ordered, text)
		}
		if !strings.Contains(text, "Index Scan using outbox_event_pkey on outbox_event e") || !strings.Contains(text, "Index Cond: (id = ANY (") {
			t.Fatalf("ordered=%v: the claim does not update its rows by primary key probes:\n%s", ordered, text)
		}
		if ordered && !strings.Contains(text, "outbox_event_pending_aggregate_idx") {
			t.Fatalf("the ordering check does not probe outbox_event_pending_aggregate_idx:\n%s", text)
		}
	}
}

// The read before each claim (paused topics and where the claim's walk
// starts) must cost O(pending topics), never O(backlog): with a topic paused,
// it probes outbox_event_pending_topic_idx once per pending topic.
func TestClaimFloorPlanProbesTheTopicIndex(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	// A paused backlog of 40,000 rows in id order before 2,000 rows of
	// three running topics, and published history.
	_, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, published_at)
		SELECT uuid_generate_v7_like, 'plan', 'a' || g, 1,
		       CASE WHEN g <= 20000 THEN 'history' WHEN g <= 60000 THEN 'paused' ELSE 'run' || (g % 3) END,
		       'plan.v1', '{}'::jsonb,
		       CASE WHEN g <= 20000 THEN 'published' ELSE 'pending' END,
		       CASE WHEN g <= 20000 THEN now() END
		  FROM generate_series(1, 62000) g,
		       LATERAL (SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid AS uuid_generate_v7_like) u;
		INSERT INTO outbox_topic_pause (topic, paused_by, reason) VALUES ('paused', 'test', 'plan');
		ANALYZE outbox_event; ANALYZE outbox_topic_pause`)
	if err != nil {
		t.Fatal(err)
	}
	// The relay runs it on its generic plan (claimPlanSQL).
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	relaySettings(t, tx)
	if _, err := tx.Exec(ctx, "PREPARE floor_generic (uuid, timestamptz, bool) AS "+claimFloorSQL); err != nil {
		t.Fatal(err)
	}
	text := planText(t, tx, `EXPLAIN EXECUTE floor_generic ('00000000-0000-0000-0000-000000000000', NULL, true)`)
	t.Logf("claim floor plan:\n%s", text)
	if !strings.Contains(text, "outbox_event_pending_topic_idx") || strings.Contains(text, "Seq Scan on outbox_event ") ||
		strings.Count(text, "outbox_event_pending_idx") != 1 || !strings.Contains(text, "One-Time Filter") ||
		!strings.Contains(text, "outbox_event_pending_aggregate_idx") {
		t.Fatalf("the claim floor does not probe outbox_event_pending_topic_idx:\n%s", text)
	}
	var (
		paused       []string
		floor, first *string
	)
	if err := pool.QueryRow(ctx, claimFloorSQL, uuid.Nil, nil, true).Scan(&paused, &floor, &first); err != nil {
		t.Fatal(err)
	}
	if len(paused) != 1 || paused[0] != "paused" || floor == nil || *floor != "00000000-0000-7000-8000-00000000ea61" {
		t.Fatalf("paused %v, floor %v; want [paused] and the first running id (60001)", paused, floor)
	}
	if first == nil || *first != "00000000-0000-7000-8000-000000004e21" {
		t.Fatalf("first pending id %v, want the paused backlog's first (20001)", first)
	}
}

// The claim changes no indexed column and the table leaves room on its pages
// (migration 00020), so claiming writes each new row version beside the old
// one without touching an index (a HOT update). An index on locked_until,
// lock_token or attempts, or a fuller page, would quietly double the WAL the
// relay writes per event (bench/README.md, R1): this test says so first.
func TestClaimIsAHOTUpdate(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	// Payloads of the size the benchmark uses (~1 KB), 300 events: pages as
	// full as the fill factor lets inserts make them.
	pad := strings.Repeat("x", 960)
	outboxtest.Insert(t, pool, outboxtest.Seed{N: 300, Payload: `{"pad": "` + pad + `"}`})
	for _, ordered := range []bool{true, false} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// This backend's counts not yet sent to the statistics, before and
		// after: no other session or autovacuum mixes in.
		counts := func() (upd, hot int64) {
			if err := tx.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'outbox_event'`).Scan(&upd, &hot); err != nil {
				t.Fatal(err)
			}
			return upd, hot
		}
		upd0, hot0 := counts()
		tag, err := tx.Exec(ctx, claimSQL(ordered), nil, 100, int64(30_000_000), uuid.New(), uuid.Nil, []string{})
		if err != nil {
			t.Fatal(err)
		}
		upd, hot := counts()
		upd, hot = upd-upd0, hot-hot0
		// Committed, so the next variant claims the next 100 events rather
		// than meeting this one's rolled-back versions on the same pages.
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if tag.RowsAffected() != 100 || upd != 100 {
			t.Fatalf("ordered=%v: the claim updated %d rows (stats %d), want 100", ordered, tag.RowsAffected(), upd)
		}
		if hot != upd {
			t.Fatalf("ordered=%v: %d of %d claimed rows were HOT updates: the claim now writes index entries (an index on a column it sets, or no room left on the page)", ordered, hot, upd)
		}
	}
}

// An outbox whose backlog grew faster than autoanalyze: the statistics
// still say nothing is pending (the last analyze saw only published rows). The ordering check must still probe
// outbox_event_pending_aggregate_idx by aggregate for each candidate; a plan
// that scans the whole index per candidate and filters by aggregate costs
// O(pending²) per claim (bench R2 saw a 13 s p99 at 1,000 events/s).
func TestClaimPlanProbesByAggregateOnStaleStatistics(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `ALTER TABLE outbox_event SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	insert := func(from, to int, status string) {
		t.Helper()
		if _, err := pool.Exec(ctx, `
			INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, published_at)
			SELECT gen_random_uuid(), 'account', 'a' || (g % 1000), g, 't', 'stale.v1', '{}'::jsonb, $3,
			       CASE WHEN $3 = 'published' THEN now() END
			  FROM generate_series($1::int, $2::int) g`, from, to, status); err != nil {
			t.Fatal(err)
		}
	}
	insert(1, 20000, "published")
	if _, err := pool.Exec(ctx, `ANALYZE outbox_event`); err != nil {
		t.Fatal(err)
	}
	insert(20001, 25000, "pending") // not analyzed
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	plan := claimPlan(t, tx, true, "00000000-0000-0000-0000-000000000000")
	if !strings.Contains(plan, "Index Cond: ((aggregate_type = c.aggregate_type) AND (aggregate_id = c.aggregate_id)") || strings.Contains(plan, "Join Filter") {
		t.Fatalf("the ordering check does not probe by aggregate on stale statistics:\n%s", plan)
	}
}

// The held count runs in every dashboard snapshot: it must take the first
// dead event of each aggregate from the dead rows' own index in aggregate
// order (migration 00023), without sorting them or reading the table, and
// probe outbox_event_pending_aggregate_idx once per such aggregate.
func TestHeldPlanWalksTheDeadRowsInAggregateOrder(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	// 40,000 published rows of history, 8,000 pending, and 1,000 dead rows:
	// four per aggregate for 250 aggregates, as a poison storm leaves them.
	_, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, published_at, dead_at)
		SELECT gen_random_uuid(), 'plan', 'a' || (g % 2000), g, 't', 'plan.v1', '{}'::jsonb,
		       CASE WHEN g <= 40000 THEN 'published' WHEN g <= 48000 THEN 'pending' ELSE 'dead' END,
		       CASE WHEN g <= 40000 THEN now() END,
		       CASE WHEN g > 48000 THEN now() END
		  FROM generate_series(1, 48000) g;
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, dead_at)
		SELECT gen_random_uuid(), 'plan', 'a' || (g % 250), 100000 + g, 't', 'plan.v1', '{}'::jsonb, 'dead', now()
		  FROM generate_series(1, 1000) g`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE outbox_event`); err != nil {
		t.Fatal(err)
	}
	text := explain(t, pool, (&HeldRead{}).Expr(nil), nil)
	t.Logf("held plan:\n%s", text)
	if !strings.Contains(text, "outbox_event_dead_aggregate_idx") || strings.Contains(text, "Sort") || strings.Contains(text, "Seq Scan") {
		t.Fatalf("the held count does not walk outbox_event_dead_aggregate_idx in order:\n%s", text)
	}
	if !strings.Contains(text, "outbox_event_pending_aggregate_idx") {
		t.Fatalf("the held count does not probe outbox_event_pending_aggregate_idx:\n%s", text)
	}
}
