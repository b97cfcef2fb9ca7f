package outbox

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// seedHeld writes aggregates h-0 … h-(aggregates-1), each a dead event at
// seq 1 holding held pending events after it, and one aggregate with
// nothing dead.
func seedHeld(t *testing.T, pool *pgxpool.Pool, aggregates, held int) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload,
		                          status, dead_at, dead_reason)
		SELECT gen_random_uuid(), 'test', a, s, 'held.topic', 'test.v1', '{}',
		       CASE WHEN s = 1 AND a <> 'free' THEN 'dead' ELSE 'pending' END,
		       CASE WHEN s = 1 AND a <> 'free' THEN now() END,
		       CASE WHEN s = 1 AND a <> 'free' THEN 'poison' END
		  FROM (SELECT 'h-' || g AS a FROM generate_series(0, $1::int - 1) g UNION ALL SELECT 'free') aggs,
		       generate_series(1, $2::int + 1) s`, aggregates, held); err != nil {
		t.Fatal(err)
	}
}

func readHeldWithin(t *testing.T, pool *pgxpool.Pool, aggs, events int) Held {
	t.Helper()
	r := HeldRead{aggregates: aggs, events: events}
	if _, err := db.ReadAllGeneric(context.Background(), pool, &r); err != nil {
		t.Fatal(err)
	}
	return r.Held
}

// The held count is exact below its limits and a lower bound, flagged
// Partial, past either: dead aggregates beyond the first ones looked at, or
// an aggregate holding more than its share of the events counted.
func TestHeldCountIsExactBelowItsLimitsAndALowerBoundPast(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	seedHeld(t, pool, 5, 3) // 5 dead aggregates, 3 held events each

	for _, c := range []struct {
		name         string
		aggs, events int
		want         Held
	}{
		{"below both limits", 5, 100, Held{Events: 15, Aggregates: 5}},
		{"each aggregate at exactly its share", 5, 15, Held{Events: 15, Aggregates: 5}},
		{"more dead aggregates than are looked at", 3, 100, Held{Events: 9, Aggregates: 3, Partial: true}},
		{"more held events than an aggregate's share", 5, 10, Held{Events: 10, Aggregates: 5, Partial: true}},
		{"a share below one event is one", 5, 2, Held{Events: 5, Aggregates: 5, Partial: true}},
	} {
		if got := readHeldWithin(t, pool, c.aggs, c.events); got != c.want {
			t.Errorf("%s (%d aggregates, %d events): held %+v, want %+v", c.name, c.aggs, c.events, got, c.want)
		}
	}
	// The product's limits are far above this: exact.
	if got, err := ReadHeld(context.Background(), pool); err != nil || got != (Held{Events: 15, Aggregates: 5}) {
		t.Fatalf("ReadHeld %+v (%v), want 15 events in 5 aggregates, exact", got, err)
	}
}

// Nothing dead: nothing held, not partial, one row all the same.
func TestHeldCountWithNothingDead(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	seedHeld(t, pool, 0, 3)
	if got := readHeldWithin(t, pool, 2, 10); got != (Held{}) {
		t.Fatalf("held %+v with nothing dead, want zero", got)
	}
}

// The read's work stops at its limits, whatever is dead: the snapshot runs
// it every tick, so an incident that dead-letters thousands of aggregates
// must not make each tick read them all. On the generic plan the snapshot
// runs, the walk of the dead letters reads at most aggs+1 entries, and the
// pending events are probed for at most aggs aggregates, each for at most
// its share plus one.
func TestHeldReadStopsAtItsLimits(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	seedHeld(t, pool, 200, 30)
	if _, err := pool.Exec(context.Background(), `ANALYZE outbox_event`); err != nil {
		t.Fatal(err)
	}
	const aggs, events = 10, 50 // a share of 5 events
	r := HeldRead{aggregates: aggs, events: events}
	sql, args := db.Compose(&r)
	lines, err := db.ExplainGeneric(context.Background(), pool, "ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF", sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	plan := strings.Join(lines, "\n")
	actual := regexp.MustCompile(`actual rows=(\d+) loops=(\d+)`)
	rowsOf := func(node string) (rows, loops int) {
		for i, l := range lines {
			if strings.Contains(l, node) {
				// The node's own line, or the next one, carries its figures.
				for _, s := range lines[i:min(i+2, len(lines))] {
					if m := actual.FindStringSubmatch(s); m != nil {
						rows, _ = strconv.Atoi(m[1])
						loops, _ = strconv.Atoi(m[2])
						return rows, loops
					}
				}
			}
		}
		t.Fatalf("no %q in the plan:\n%s", node, plan)
		return 0, 0
	}
	if rows, _ := rowsOf("outbox_event_dead_aggregate_idx"); rows > aggs+1 {
		t.Errorf("the walk of the dead letters read %d entries, want at most %d:\n%s", rows, aggs+1, plan)
	}
	rows, loops := rowsOf("outbox_event_pending_aggregate_idx")
	if loops > aggs || rows > events/aggs+1 {
		t.Errorf("the held events were probed %d times, %d rows each, want at most %d times and %d rows:\n%s",
			loops, rows, aggs, events/aggs+1, plan)
	}
	if r, err := ReadHeld(context.Background(), pool); err != nil || r != (Held{Events: 6000, Aggregates: 200}) {
		t.Fatalf("ReadHeld %+v (%v), want 6,000 events in 200 aggregates", r, err)
	}
}

// collectList pages through f, n rows a page, with listSQL's form.
func collectList(t *testing.T, pool *pgxpool.Pool, f Filter, oldest, byDead bool, n int) []string {
	t.Helper()
	var (
		out []string
		p   = Page{Oldest: oldest, Limit: n}
	)
	for range 1000 {
		sql, args, limit, err := listSQL(f, p, byDead)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := pool.Query(context.Background(), sql, args)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, scanListRow)
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range got {
			if i < limit {
				out = append(out, fmt.Sprintf("%s %s#%d %s held=%v", l.ID, l.AggregateID, l.AggregateSeq, l.Topic, l.Held))
			}
		}
		if len(got) <= limit {
			return out
		}
		p.After = encodeCursor(f, oldest, got[limit-1].ID)
	}
	t.Fatal("more than 1,000 pages")
	return nil
}

// The held_dead list read from the dead letters is the same list as the one
// read from the pending events, page after page, in both orders and with the
// filter's other conditions; its count too.
func TestHeldDeadListFromTheDeadLettersIsTheSameList(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	// 40 aggregates of 12 events on two topics (ids in creation order, as
	// UUIDv7); dead events in some: two in one aggregate, one at its end
	// (holding nothing), one at its start.
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload)
		SELECT (lpad(to_hex($1::bigint + s * 40 + a), 12, '0') || '7000' || '8000' || lpad(to_hex(s * 40 + a), 12, '0'))::uuid,
		       'test', 'a' || a, s, CASE WHEN a % 3 = 0 THEN 'left' ELSE 'right' END, 'test.v' || (s % 2), '{}'
		  FROM generate_series(0, 39) a, generate_series(1, 12) s`, time.Now().Add(-time.Hour).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		UPDATE outbox_event SET status = 'dead', dead_at = now(), dead_reason = 'poison'
		 WHERE (aggregate_id, aggregate_seq) IN (('a1', 5), ('a1', 8), ('a2', 12), ('a3', 1), ('a7', 3), ('a12', 11), ('a30', 6))`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE outbox_event SET status = 'published', published_at = now()
		 WHERE (aggregate_id, aggregate_seq) IN (('a30', 7), ('a4', 1))`); err != nil {
		t.Fatal(err)
	}
	from := time.Now().Add(-time.Hour).Add(6 * 40 * time.Millisecond)
	for _, f := range []Filter{
		{Status: FilterHeldDead},
		{Status: FilterHeldDead, Topic: "right"},
		{Status: FilterHeldDead, EventType: "test.v1"},
		{Status: FilterHeldDead, AggregateType: "test", AggregateID: "a1"},
		{Status: FilterHeldDead, CreatedFrom: from},
	} {
		for _, oldest := range []bool{false, true} {
			want := collectList(t, pool, f, oldest, false, 4)
			got := collectList(t, pool, f, oldest, true, 4)
			if len(want) == 0 || strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("%+v oldest=%v: from the dead letters\n%s\nfrom the pending events\n%s", f, oldest, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if byDead, err := listByDead(ctx, pool, f, Page{Oldest: oldest}); err != nil || !byDead {
				t.Errorf("%+v: List reads %d held events from the pending events (%v)", f, len(want), err)
			}
			if !oldest {
				total, err := Count(ctx, pool, f)
				if err != nil || total.N != int64(len(want)) || total.Estimate {
					t.Errorf("%+v: count %+v (%v), the list has %d", f, total, err, len(want))
				}
			}
		}
	}
	// a1: 6 (after its first dead letter, the second one not pending); a2:
	// none (its dead letter is its last event); a3: 11; a7: 9; a12: 1; a30: 5
	// (one after its dead letter is published): 32.
	if total, err := Count(ctx, pool, Filter{Status: FilterHeldDead}); err != nil || total.N != 32 {
		t.Fatalf("held_dead count %+v (%v), want 32", total, err)
	}
}

// Many held events are read from the pending events (the dead letters'
// form would sort them all for each page); a few, from the dead letters,
// without walking the pending events: one poison message in a backlog.
func TestHeldDeadListReadsFewHeldEventsFromTheDeadLetters(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	// A backlog of 20,000 pending events, and one aggregate holding 3
	// behind a dead letter.
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload)
		SELECT gen_random_uuid(), 'test', 'b' || g, 1, 'backlog', 'test.v1', '{}' FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	seedHeld(t, pool, 1, 3)
	if _, err := pool.Exec(ctx, `ANALYZE outbox_event`); err != nil {
		t.Fatal(err)
	}
	f := Filter{Status: FilterHeldDead}
	if byDead, err := listByDead(ctx, pool, f, Page{}); err != nil || !byDead {
		t.Fatalf("3 held events: from the dead letters %v (%v), want true", byDead, err)
	}
	sql, args, _, err := listSQL(f, Page{}, true)
	if err != nil {
		t.Fatal(err)
	}
	plan := explain(t, pool, "(ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) "+sql, args)
	if strings.Contains(plan, "outbox_event_pending_idx") || strings.Contains(plan, "Seq Scan on outbox_event") ||
		!strings.Contains(plan, "outbox_event_dead_aggregate_idx") {
		t.Fatalf("the page walks the backlog rather than the dead letters:\n%s", plan)
	}
	if page, err := List(ctx, pool, f, Page{}); err != nil || len(page.Rows) != 3 {
		t.Fatalf("list: %d rows (%v), want the 3 held events", len(page.Rows), err)
	}

	// 10,001 held events behind one more dead letter: from the pending events.
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, dead_at, dead_reason)
		SELECT gen_random_uuid(), 'test', 'many', s, 'backlog', 'test.v1', '{}',
		       CASE s WHEN 1 THEN 'dead' ELSE 'pending' END, CASE s WHEN 1 THEN now() END, CASE s WHEN 1 THEN 'poison' END
		  FROM generate_series(1, $1::int + 2) s`, CountExactBelow); err != nil {
		t.Fatal(err)
	}
	if byDead, err := listByDead(ctx, pool, f, Page{}); err != nil || byDead {
		t.Fatalf("%d held events: from the dead letters %v (%v), want false", CountExactBelow+4, byDead, err)
	}
	if page, err := List(ctx, pool, f, Page{Limit: 10}); err != nil || len(page.Rows) != 10 || page.Next == "" {
		t.Fatalf("list: %d rows, next %q (%v)", len(page.Rows), page.Next, err)
	}
	if total, err := Count(ctx, pool, f); err != nil || !total.Estimate || total.N <= CountExactBelow {
		t.Fatalf("count %+v (%v): want an estimate above %d", total, err, CountExactBelow)
	}
}
