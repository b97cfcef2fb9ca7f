package audit_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// TestListPlansUseIndexes checks the list's plans on a trail of 300,000
// rows: every filter reads an index, none scans the table.
func TestListPlansUseIndexes(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		INSERT INTO audit_event (occurred_at, actor_iss, actor_sub, actor_name, action, target_type, target_id, outcome, prev_hash, hash)
		SELECT timestamptz '2025-01-01' + make_interval(secs => g), 'https://idp', 'sub-' || (g % 1000), 'user ' || (g % 1000),
		       'action.' || (g % 50), 'outbox_event', md5(g::text), (ARRAY['ok', 'ok', 'ok', 'denied', 'error'])[1 + g % 5],
		       '\x00', '\x00'
		  FROM generate_series(1, 300000) g;
		ANALYZE audit_event;`); err != nil {
		t.Fatal(err)
	}
	day := time.Date(2025, 1, 2, 0, 0, 0, 0, time.UTC)
	for name, f := range map[string]audit.Filter{
		"none":             {},
		"actor sub":        {Actor: "sub-7"},
		"actor name":       {Actor: "user 7"},
		"action":           {Action: "action.7"},
		"target":           {TargetType: "outbox_event", TargetID: "c4ca4238a0b923820dcc509a6f75849b"},
		"time":             {From: day, To: day.Add(time.Hour)},
		"actor and time":   {Actor: "sub-7", From: day, To: day.Add(time.Hour)},
		"outcome and time": {Outcome: "denied", From: day, To: day.Add(time.Hour)},
	} {
		for _, after := range []int64{0, 150000} {
			sql, args, err := audit.ListSQL(ctx, pool, f, after)
			if err != nil {
				t.Fatal(err)
			}
			if plan := explain(t, pool, sql, args); strings.Contains(plan, "Seq Scan") {
				t.Errorf("%s (after %d): a sequential scan:\n%s", name, after, plan)
			}
		}
	}
}

// countSQL is Count's capped count for f, with its arguments.
func countSQL(t *testing.T, pool *pgxpool.Pool, f audit.Filter) (string, pgx.NamedArgs) {
	t.Helper()
	fw, args, err := audit.CountFrom(context.Background(), pool, f)
	if err != nil {
		t.Fatal(err)
	}
	args["db_count_cap"] = db.CountExactBelow + 1
	return db.CountSQL(fw), args
}

// The outcome filter reads audit_event_outcome_idx (migration 00034). On
// this trail errors are 1% of the rows, and all of them action.49's: the
// count of errors and a page of an action or an actor that never errs read
// the errors, never the whole trail or the action's rows.
func TestOutcomeFilterReadsItsIndex(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		INSERT INTO audit_event (occurred_at, actor_iss, actor_sub, actor_name, action, target_type, target_id, outcome, prev_hash, hash)
		SELECT timestamptz '2025-01-01' + make_interval(secs => g), 'https://idp', 'sub-' || (g % 40), 'user ' || (g % 40),
		       'action.' || (g % 50), 'outbox_event', md5(g::text),
		       CASE WHEN g % 100 = 99 THEN 'error' WHEN g % 100 BETWEEN 60 AND 74 THEN 'denied' ELSE 'ok' END,
		       '\x00', '\x00'
		  FROM generate_series(1, 300000) g;
		ANALYZE audit_event;`); err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]audit.Filter{
		"errors":                 {Outcome: audit.OutcomeError},
		"an action without them": {Action: "action.7", Outcome: audit.OutcomeError},
		"an actor without them":  {Actor: "sub-8", Outcome: audit.OutcomeError},
		"a target type":          {TargetType: "outbox_event", Outcome: audit.OutcomeError},
	} {
		sql, args, err := audit.ListSQL(ctx, pool, f, 0)
		if err != nil {
			t.Fatal(err)
		}
		count, cargs := countSQL(t, pool, f)
		for what, plan := range map[string]string{"page": explain(t, pool, sql, args), "count": explain(t, pool, count, cargs)} {
			if name == "errors" && what == "page" {
				// A page of errors is found soon along the primary key too.
				if strings.Contains(plan, "Seq Scan") {
					t.Errorf("%s, %s: a sequential scan:\n%s", name, what, plan)
				}
				continue
			}
			if strings.Contains(plan, "Seq Scan") || !strings.Contains(plan, "audit_event_outcome_idx") {
				t.Errorf("%s, %s: does not read the outcome index:\n%s", name, what, plan)
			}
		}
	}
	// ok is most of the trail: a page walks the primary key, its count is
	// the planner's estimate (nothing read).
	if n, err := audit.Count(ctx, pool, audit.Filter{Outcome: audit.OutcomeOK}); err != nil || !n.Estimate || n.N < 100_000 {
		t.Fatalf("count of ok rows %+v (%v), want an estimate", n, err)
	}
	if n, err := audit.Count(ctx, pool, audit.Filter{Action: "action.7", Outcome: audit.OutcomeError}); err != nil || n != (audit.Total{}) {
		t.Fatalf("count of action.7's errors %+v (%v), want exactly 0", n, err)
	}
}

// The list's page and count are planned for their values on every call
// (db.PlanEachCall): neither is kept as a prepared statement, whose generic
// plan PostgreSQL may switch to after five runs. On this trail that plan
// differs: four actors of a quarter of the rows each, so the generic count
// of "an actor" expects to stop soon along a scan of the trail, where an
// actor with no rows is two index probes.
func TestListIsPlannedForItsValues(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		INSERT INTO audit_event (occurred_at, actor_iss, actor_sub, actor_name, action, target_type, target_id, outcome, prev_hash, hash)
		SELECT timestamptz '2025-01-01' + make_interval(secs => g), 'https://idp', 'sub-' || (g % 4), 'user ' || (g % 4),
		       'action.' || (g % 50), 'outbox_event', md5(g::text), 'ok', '\x00', '\x00'
		  FROM generate_series(1, 60000) g;
		ANALYZE audit_event;`); err != nil {
		t.Fatal(err)
	}
	sql, args := countSQL(t, pool, audit.Filter{Actor: "nobody"})
	named := db.NewNamed(sql)
	lines, err := db.ExplainGeneric(ctx, pool, "", named.SQL(), named.Args(args)...)
	if err != nil {
		t.Fatal(err)
	}
	generic, custom := strings.Join(lines, "\n"), explain(t, pool, sql, args)
	if !strings.Contains(generic, "Seq Scan") || strings.Contains(custom, "Seq Scan") {
		t.Fatalf("the generic plan should scan the trail and the plan for nobody not:\ngeneric:\n%s\nfor nobody:\n%s", generic, custom)
	}

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// The EXPLAINs above may have run on this connection.
	if err := conn.Conn().DeallocateAll(ctx); err != nil {
		t.Fatal(err)
	}
	for _, actor := range []string{"sub-1", "nobody", "user 2", "sub-3", "nobody", "sub-0", "user 1", "nobody"} {
		f := audit.Filter{Actor: actor}
		if _, err := audit.List(ctx, conn, f, audit.Page{}); err != nil {
			t.Fatal(err)
		}
		if _, err := audit.Count(ctx, conn, f); err != nil {
			t.Fatal(err)
		}
	}
	if stmts := dbtest.Prepared(t, conn, "audit_event"); len(stmts) > 0 {
		t.Fatalf("kept as prepared statements (a generic plan may serve them):\n%s", strings.Join(stmts, "\n"))
	}
}

func TestVerifyProgressReports(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	record(t, pool, 25)
	var calls [][2]int64
	res, err := audit.VerifyProgress(context.Background(), pool, 10, func(checked, seq int64) error {
		calls = append(calls, [2]int64{checked, seq})
		return nil
	})
	if err != nil || !res.Intact() || res.Checked != 25 {
		t.Fatalf("%+v %v", res, err)
	}
	if len(calls) != 2 || calls[0][0] != 10 || calls[1][0] != 20 || calls[1][1] <= calls[0][1] {
		t.Errorf("progress calls %v", calls)
	}
}

// explain is the plan PostgreSQL makes for sql with args, one line per node.
func explain(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "EXPLAIN "+sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}
