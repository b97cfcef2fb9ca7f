package outbox

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"

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
