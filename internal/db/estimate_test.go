package db_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// rowsRead is how many rows of table t the transaction has read so far
// (sequential scans and index fetches), as its statistics count them.
func rowsRead(t *testing.T, tx pgx.Tx) int64 {
	t.Helper()
	var n int64
	if err := tx.QueryRow(context.Background(), `
		SELECT coalesce(sum(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)), 0)::bigint
		  FROM pg_stat_xact_user_tables WHERE relname = 't'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A list's total counts exactly when the planner expects few rows, and
// when it expects many as long as the count ends within its budget (the
// estimate alone can be far off); only a count that cannot end in time
// gives way to the estimate, flagged. It says "more than" when a count
// reaches the cap.
// Each case runs in a transaction whose table statistics show the rows it
// read.
func TestCountTotalCountsWithinABudget(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	// k: ten values of 20,000 rows; c equals k (the planner takes the two
	// for independent, so k = c is estimated at a tenth of its rows).
	if _, err := pool.Exec(ctx, `
		CREATE TABLE t (id bigint PRIMARY KEY, k int NOT NULL, c int NOT NULL);
		INSERT INTO t SELECT g, g % 10, g % 10 FROM generate_series(1, 200000) g;
		CREATE INDEX t_k_idx ON t (k);
		ANALYZE t;`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, fromWhere string
		args            pgx.NamedArgs
		want            db.Total
		wantEstimate    bool  // the estimate is N: checked as a range
		maxRead         int64 // rows the count may read; -1: its plan's business
	}{
		// Many expected: counted all the same, up to the cap, within the
		// count's budget.
		{"many: counted to the cap", "t WHERE k = @k", pgx.NamedArgs{"k": 3}, db.Total{Estimate: true, MoreThan: db.CountExactBelow}, true, db.CountExactBelow + 20},
		// Many expected, none there (k and c go together: the planner
		// takes k = 3 AND c <> 3 for 18,000 rows): the count says so,
		// where the estimate alone read "≈ 18k" over an empty list.
		{"many expected, none there: counted", "t WHERE k = @k AND c <> @k", pgx.NamedArgs{"k": 3}, db.Total{}, false, -1},
		// A count that cannot end within its budget (each row costs a
		// sleep of 0.1 ms: 10,001 of them take a second) gives way to the
		// estimate.
		{"many, slow to count: the estimate", "t WHERE k = @k AND pg_sleep(0.0001) IS NOT NULL", pgx.NamedArgs{"k": 3}, db.Total{Estimate: true}, true, -1},
		// Its 500 ids, and the few the planner reads at an index's end.
		{"few: counted", "t WHERE k = @k AND id <= 500", pgx.NamedArgs{"k": 3}, db.Total{N: 50}, false, 520},
		{"none: counted", "t WHERE k = @k", pgx.NamedArgs{"k": 42}, db.Total{}, false, 0},
		// Estimated at 2,000, 20,000 match: the count stops past the cap.
		{"more than the estimate: capped", "t WHERE k = @k AND c = @k", pgx.NamedArgs{"k": 3},
			db.Total{Estimate: true, MoreThan: db.CountExactBelow}, true, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			before := rowsRead(t, tx)
			got, err := db.CountTotal(ctx, tx, c.fromWhere, c.args)
			if err != nil {
				t.Fatal(err)
			}
			read := rowsRead(t, tx) - before
			if c.wantEstimate {
				if got.N <= db.CountExactBelow || got.N > 200_000 {
					t.Errorf("N = %d, want the planner's figure above %d", got.N, db.CountExactBelow)
				}
				got.N = 0
			}
			if got != c.want {
				t.Errorf("total %+v, want %+v", got, c.want)
			}
			if c.maxRead >= 0 && read > c.maxRead {
				t.Errorf("read %d rows, want at most %d", read, c.maxRead)
			}
		})
	}

	// A dry run's count counts first: "more than" is always a count's.
	tot, err := db.CountUpTo(ctx, pool, "t WHERE k = @k", pgx.NamedArgs{"k": 3}, 100)
	if err != nil || tot.MoreThan != 100 || !tot.Estimate || tot.N < 101 || tot.Counted() != 101 {
		t.Fatalf("count up to 100 of 20,000: %+v (%v)", tot, err)
	}
	if tot, err := db.CountUpTo(ctx, pool, "t WHERE k = @k AND id <= 500", pgx.NamedArgs{"k": 3}, 100); err != nil || tot != (db.Total{N: 50}) || tot.Counted() != 50 {
		t.Fatalf("count up to 100 of 50: %+v (%v)", tot, err)
	}
}
