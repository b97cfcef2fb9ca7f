package db_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// sinceRead counts the rows of t newer than since: a parameter compared
// with a column, which is what keeps PostgreSQL planning a statement again
// on every call.
type sinceRead struct {
	since time.Time
	n     int64
}

func (r *sinceRead) Expr(args *db.Args) string {
	return `SELECT count(*) FROM t WHERE ts > ` + args.Add(r.since)
}

func (r *sinceRead) Scan(src []byte) (err error) {
	r.n, err = strconv.ParseInt(string(src), 10, 64)
	return err
}

// ReadAllGeneric runs its statement on one generic plan for every call,
// with the right answers, and the setting does not outlive the batch: the
// connection goes back to its pool with the server's default.
func TestReadAllGenericPlansOnceAndLeavesNoSetting(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE t (ts timestamptz NOT NULL);
		CREATE INDEX ON t (ts);
		INSERT INTO t SELECT '2026-01-01'::timestamptz + i * interval '1 minute' FROM generate_series(1, 5000) i;
		ANALYZE t`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	const calls = 8
	for i := 1; i <= calls; i++ {
		r := &sinceRead{since: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(5000-i*100) * time.Minute)}
		now, err := db.ReadAllGeneric(ctx, conn, r)
		if err != nil {
			t.Fatal(err)
		}
		if want := int64(i * 100); r.n != want || now.IsZero() {
			t.Fatalf("call %d: count %d, want %d (now %v)", i, r.n, want, now)
		}
	}
	sql, _ := db.Compose(&sinceRead{})
	var generic, custom int64
	if err := conn.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`, sql).Scan(&generic, &custom); err != nil {
		t.Fatalf("the statement is not prepared on the connection: %v", err)
	}
	if generic != calls || custom != 0 {
		t.Fatalf("%d generic and %d custom plans for %d calls: want every call on the generic plan", generic, custom, calls)
	}
	var mode string
	if err := conn.QueryRow(ctx, `SELECT current_setting('plan_cache_mode')`).Scan(&mode); err != nil || mode != "auto" {
		t.Fatalf("plan_cache_mode after the batch: %q (%v), want the default", mode, err)
	}

	// A failing statement is an error, and leaves the connection as clean.
	if _, err := db.ReadAllGeneric(ctx, conn, badRead{}); err == nil || !strings.Contains(err.Error(), "no_such_table") {
		t.Fatalf("a failing read returned %v", err)
	}
	if err := conn.QueryRow(ctx, `SELECT current_setting('plan_cache_mode')`).Scan(&mode); err != nil || mode != "auto" {
		t.Fatalf("plan_cache_mode after a failed batch: %q (%v), want the default", mode, err)
	}
}

// settingsRead reads the settings its statement runs under.
type settingsRead struct{ got string }

func (r *settingsRead) Expr(*db.Args) string {
	return `SELECT concat_ws(',', current_setting('plan_cache_mode'), current_setting('max_parallel_workers_per_gather'), current_setting('jit'))`
}

func (r *settingsRead) Scan(src []byte) error { r.got = string(src); return nil }

// The statement runs on its generic plan with neither parallel workers nor
// JIT: a plan made once for every call must not start workers or compile
// itself on an estimate.
func TestReadAllGenericRunsWithoutWorkersOrJIT(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	var r settingsRead
	if _, err := db.ReadAllGeneric(context.Background(), pool, &r); err != nil {
		t.Fatal(err)
	}
	if r.got != "force_generic_plan,0,off" {
		t.Fatalf("the statement ran under plan_cache_mode, max_parallel_workers_per_gather, jit = %s", r.got)
	}
}

type badRead struct{}

func (badRead) Expr(*db.Args) string { return `SELECT count(*) FROM no_such_table` }
func (badRead) Scan([]byte) error    { return nil }

// ExplainGeneric shows the generic plan (the parameter, not its value, in
// the index condition), and can run again on the same connection.
func TestExplainGenericShowsTheGenericPlan(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE t (ts timestamptz NOT NULL); CREATE INDEX t_ts ON t (ts); ANALYZE t`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	sql, args := db.Compose(&sinceRead{since: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)})
	for i := range 2 {
		lines, err := db.ExplainGeneric(ctx, conn.Conn(), "", sql, args...)
		if err != nil {
			t.Fatalf("explain %d: %v", i, err)
		}
		plan := strings.Join(lines, "\n")
		if !strings.Contains(plan, "ts > $1") {
			t.Fatalf("explain %d is not the generic plan:\n%s", i, plan)
		}
	}
	var left int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'sluice_explain_generic%'`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d explain statements left prepared (%v)", left, err)
	}
}
