package outbox

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// planRows is the size of the plan test's outbox: a million rows of history
// (generate_series; about a minute on a 2-core machine).
const planRows = 1_000_000

// seedPlanRows writes n events with time-ordered (UUIDv7-shaped) ids: 97%
// published, 2% pending, 0.5% dead, 0.5% discarded; ten common topics and a
// rare one; 50 common event types and a rare one; aggregates of ten events.
func seedPlanRows(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	_, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status,
		                          published_at, dead_at, discarded_at, last_error)
		SELECT (lpad(to_hex($2::bigint + g), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
		       'plan', 'a' || (g % ($1 / 10)), g / ($1 / 10) + 1,
		       CASE WHEN g % 10000 = 0 THEN 'rare' ELSE 't' || (g % 10) END,
		       CASE WHEN g % 10000 = 1 THEN 'plan.rare.v1' ELSE 'plan.e' || (g % 50) || '.v1' END, '{}'::jsonb, s,
		       CASE WHEN s = 'published' THEN now() END,
		       CASE WHEN s IN ('dead', 'discarded') THEN now() END,
		       CASE WHEN s = 'discarded' THEN now() END,
		       CASE WHEN s <> 'published' THEN 'broker said no' END
		  FROM generate_series(1, $1) g,
		       LATERAL (SELECT md5(g::text) AS h,
		                       CASE WHEN g % 200 = 7 THEN 'dead' WHEN g % 200 = 8 THEN 'discarded'
		                            WHEN g % 100 IN (3, 4) THEN 'pending' ELSE 'published' END AS s) x`,
		n, time.Now().Add(-24*time.Hour).UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE outbox_event`); err != nil {
		t.Fatal(err)
	}
	t.Logf("seeded %d rows in %s", n, time.Since(start).Round(time.Second))
}

// sameOr names the cases where a second index is as good as the wanted one
// at every depth, so the planner may pick either on either page.
var sameOr = map[string]string{"common event type": "outbox_event_type_idx"}

var indexUse = regexp.MustCompile(`(?:Index Scan|Index Only Scan|Index Scan Backward|Bitmap Index Scan)(?: Backward)? (?:using|on) (\w+)`)

func explain(t *testing.T, pool *pgxpool.Pool, sql string, args pgx.NamedArgs) string {
	t.Helper()
	return planText(t, pool, "EXPLAIN "+sql, args)
}

// planText runs an EXPLAIN statement on q (a pool or a transaction) and
// returns its lines.
func planText(t *testing.T, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, explainSQL string, args ...any) string {
	t.Helper()
	rows, err := q.Query(context.Background(), explainSQL, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

func indexesOf(plan string) []string {
	var out []string
	for _, m := range indexUse.FindAllStringSubmatch(plan, -1) {
		out = append(out, m[1])
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// A deep keyset page reads the same index path as the first page, for every
// common filter, and neither sorts nor scans the table: a page costs the
// rows it shows (plus the filter's misses), however deep it is.
func TestListPlansAreTheSameOnADeepPage(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	seedPlanRows(t, pool, planRows)
	// A position 70% of the way back from the newest row.
	var deep uuid.UUID
	if err := pool.QueryRow(context.Background(), `SELECT id FROM outbox_event ORDER BY id OFFSET $1 LIMIT 1`, planRows*3/10).Scan(&deep); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		f      Filter
		oldest bool
		want   string // an index the plan must use
		sorts  bool   // a sort is fine: it sorts one aggregate's events
	}{
		{"everything", Filter{}, false, "outbox_event_pkey", false},
		{"everything oldest first", Filter{}, true, "outbox_event_pkey", false},
		{"published", Filter{Status: StatusPublished}, false, "outbox_event_pkey", false},
		{"pending", Filter{Status: StatusPending}, false, "outbox_event_pending_idx", false},
		{"held", Filter{Status: FilterHeld}, false, "outbox_event_pending_idx", false},
		{"dead", Filter{Status: StatusDead}, false, "outbox_event_dead_id_idx", false},
		{"discarded", Filter{Status: StatusDiscarded}, false, "outbox_event_discarded_idx", false},
		{"rare topic", Filter{Topic: "rare"}, false, "outbox_event_topic_idx", false},
		{"rare event type", Filter{EventType: "plan.rare.v1"}, false, "outbox_event_type_idx", false},
		// A common type is 2% of the rows: walking the primary key finds a
		// page in a few thousand rows, and walking the type's index finds it
		// in fifty. Both are bounded whatever the depth; which one the
		// planner picks depends on how many pages the table spans (the fill
		// factor of migration 00020 doubled them), so either is accepted,
		// on each page (see sameOr below).
		{"common event type", Filter{EventType: "plan.e7.v1"}, false, "outbox_event_pkey", false},
		{"aggregate", Filter{AggregateType: "plan", AggregateID: "a42"}, false, "outbox_event_aggregate_type_aggregate_id_aggregate_seq_key", true},
		{"dead errors", Filter{Status: StatusDead, ErrorText: "said"}, false, "outbox_event_dead_id_idx", false},
		{"created range", Filter{CreatedFrom: time.Now().Add(-20 * time.Hour), CreatedTo: time.Now().Add(-2 * time.Hour)}, false, "outbox_event_pkey", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			first, args, _, err := listSQL(c.f, Page{Oldest: c.oldest}, false)
			if err != nil {
				t.Fatal(err)
			}
			p1 := explain(t, pool, first, args)
			deepSQL, deepArgs, _, err := listSQL(c.f, Page{Oldest: c.oldest, After: encodeCursor(c.f, c.oldest, deep)}, false)
			if err != nil {
				t.Fatal(err)
			}
			pd := explain(t, pool, deepSQL, deepArgs)
			t.Logf("page 1:\n%s\ndeep page:\n%s", p1, pd)
			i1, id := indexesOf(p1), indexesOf(pd)
			if alt, ok := sameOr[c.name]; ok {
				// Read either index as the wanted one before comparing.
				for _, ix := range [][]string{i1, id} {
					for k := range ix {
						if ix[k] == alt {
							ix[k] = c.want
						}
					}
				}
			}
			if !slices.Equal(i1, id) {
				t.Fatalf("page 1 reads %v, a deep page %v", i1, id)
			}
			if !slices.Contains(i1, c.want) {
				t.Fatalf("the list reads %v, want %s", i1, c.want)
			}
			for _, p := range []string{p1, pd} {
				if (strings.Contains(p, "Sort") && !c.sorts) || strings.Contains(p, "Seq Scan") {
					t.Fatalf("a page sorts or scans the table:\n%s", p)
				}
			}
		})
	}
	// A topic and an event type that never occur together (plan.e7.v1 is
	// t7's only). The statistics of migration 00034 can tell the planner
	// so, and it then reads the type's index where it took the two for
	// independent, expected a page soon along the primary key and walked
	// all of it. Can, not do: their most-common-values list is built from
	// a sample, and over combinations as evenly spread as these it keeps
	// a varying part of them, so a full run saw the primary key walked
	// again. What holds every time: no page or count scans the table, and
	// the count is exactly 0. A type with its own topic is still read in
	// the list's order, without a sort.
	for _, c := range []struct {
		name  string
		f     Filter
		never bool
	}{
		{"a type on another topic", Filter{Topic: "t3", EventType: "plan.e7.v1"}, true},
		{"a type on another topic, published", Filter{Topic: "t3", EventType: "plan.e7.v1", Status: StatusPublished}, true},
		{"a type on its topic", Filter{Topic: "t7", EventType: "plan.e7.v1"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var plans []string
			for _, after := range []string{"", encodeCursor(c.f, false, deep)} {
				sql, args, _, err := listSQL(c.f, Page{After: after}, false)
				if err != nil {
					t.Fatal(err)
				}
				plans = append(plans, explain(t, pool, sql, args))
			}
			cargs := pgx.NamedArgs{"db_count_cap": CountExactBelow + 1}
			fw, err := c.f.fromWhere(cargs, true)
			if err != nil {
				t.Fatal(err)
			}
			count := explain(t, pool, db.CountSQL(fw), cargs)
			for i, p := range plans {
				switch {
				case strings.Contains(p, "Seq Scan"):
					t.Errorf("page %d scans the table:\n%s", i, p)
				case c.never && !strings.Contains(p, "outbox_event_type_idx"):
					t.Logf("page %d walks the primary key, not the type's index (the statistics missed it this time):\n%s", i, p)
				case !c.never && strings.Contains(p, "Sort"):
					t.Errorf("page %d sorts:\n%s", i, p)
				}
			}
			if c.never && strings.Contains(count, "Seq Scan") {
				t.Errorf("the count scans the table:\n%s", count)
			}
			if c.never {
				if n, err := Count(context.Background(), pool, c.f); err != nil || n != (Total{}) {
					t.Errorf("count %+v (%v), want exactly 0", n, err)
				}
			}
		})
	}

	// Above the exact threshold, a count is the planner's estimate.
	n, err := Count(context.Background(), pool, Filter{Status: StatusPublished})
	if err != nil {
		t.Fatal(err)
	}
	if !n.Estimate || n.N < planRows/2 {
		t.Fatalf("count of published %+v, want an estimate near %d", n, planRows*97/100)
	}
	if n, err := Count(context.Background(), pool, Filter{Topic: "rare"}); err != nil || n.Estimate || n.N != planRows/10000 {
		t.Fatalf("count of the rare topic %+v (%v), want exactly %d", n, err, planRows/10000)
	}
	t.Logf("published estimate %d", n.N)
}
