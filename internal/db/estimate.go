package db

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// CountExactBelow is where the list pages stop counting and estimate: an
// exact count reads at most this many rows plus one.
const CountExactBelow = 10_000

// PlanEachCall, passed as a statement's first argument, has pgx send the
// statement unnamed (pgx.QueryExecModeExec), so PostgreSQL plans it for the
// values of that call. The pool's default prepares and keeps each statement
// per connection, and after five runs PostgreSQL may switch it to a generic
// plan, made for no value in particular. A list's filter is the case where
// that goes wrong: its best plan depends on the values (an actor with no
// rows, a topic and an event type that never occur together), and the
// generic plan of the audit count was a scan of the whole trail for an
// actor who had no rows (174 ms at a million rows, where the actor's index
// answers at once). The lists' and counts' statements are ad hoc and plan
// in a fraction of a millisecond, so every call plans them anew.
const PlanEachCall = pgx.QueryExecModeExec

// Total is how many rows match a list's filter: exactly N; or, with
// Estimate, about N by the planner's statistics; and, with MoreThan, more
// than MoreThan for certain (a count stopped there), N being the planner's
// figure.
type Total struct {
	N int64
	// Estimate: N is the planner's row estimate, not a count.
	Estimate bool
	// MoreThan, when not zero, is where a count stopped: more than
	// MoreThan rows match (Estimate is then set; N is at least MoreThan+1).
	MoreThan int64
}

// Counted is what a count read of t: N when exact, MoreThan+1 when it
// stopped at its cap. A dry run's confirmation compares two of these, so
// "more than 10,000" confirms any number past the cap and an exact count
// confirms at most itself.
func (t Total) Counted() int64 {
	if t.MoreThan > 0 {
		return t.MoreThan + 1
	}
	return t.N
}

// CountTotal is how many rows of `SELECT 1 FROM <fromWhere>` match, for a
// list page's header. The planner's estimate comes first (EXPLAIN: nothing
// is read). At or below CountExactBelow the rows are counted, at most
// CountExactBelow+1 of them (a count over a LIMIT'd subquery); a count that
// reaches the cap says MoreThan. Above it they are counted all the same
// within countBudget, and only a count that cannot end in time gives the
// estimate, flagged (countWithin): the estimate alone is far off where the
// filter's columns go together, and counting first without a bound read far
// past the cap whenever the plan could not stop early (a bitmap scan reads
// all its index entries before its first row). A list page whose first page
// is the whole list does not count at all (web). Use CountUpTo for a filter
// the planner cannot estimate. args must not use "db_count_cap".
func CountTotal(ctx context.Context, q Querier, fromWhere string, args pgx.NamedArgs) (Total, error) {
	est, err := EstimateRows(ctx, q, fromWhere, args)
	if err != nil {
		return Total{}, err
	}
	if est > CountExactBelow {
		// The estimate can be far off where the filter's columns go
		// together (an actor and the actions only that actor takes: 100
		// rows estimated at 40,000), and "≈ 40k" over a list of 100 would
		// be a number with two definitions. So the rows are counted all the
		// same, within countBudget: a count that ends is the answer; one
		// that would read on (a plan that cannot stop early) gives way to
		// the estimate.
		if b, ok := q.(Beginner); ok {
			t, ended, err := countWithin(ctx, b, fromWhere, args, est)
			if err != nil || ended {
				return t, err
			}
		}
		return Total{N: est, Estimate: true}, nil
	}
	return countAtMost(ctx, q, fromWhere, args, CountExactBelow, est)
}

// countBudget bounds the count CountTotal runs past a large estimate.
const countBudget = 100 * time.Millisecond

// codeQueryCanceled is PostgreSQL's SQLSTATE for a statement_timeout.
const codeQueryCanceled = "57014"

// countWithin is countAtMost in a transaction (a savepoint in one) whose
// statements may run countBudget; ended is false when the count ran out of
// time. The transaction is always rolled back: SET LOCAL ends with it.
func countWithin(ctx context.Context, b Beginner, fromWhere string, args pgx.NamedArgs, est int64) (t Total, ended bool, err error) {
	tx, err := b.Begin(ctx)
	if err != nil {
		return Total{}, false, fmt.Errorf("count: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", countBudget.Milliseconds())); err != nil {
		return Total{}, false, fmt.Errorf("count: %w", err)
	}
	t, err = countAtMost(ctx, tx, fromWhere, args, CountExactBelow, est)
	if Code(err) == codeQueryCanceled && ctx.Err() == nil {
		return Total{}, false, nil
	}
	return t, err == nil, err
}

// CountUpTo counts the rows of `SELECT 1 FROM <fromWhere>` exactly up to
// most, reading at most most+1 rows; past it, it says MoreThan most, with
// the planner's estimate as N. It counts before it estimates, so "more than"
// is always a count's: for a dry run, whose confirmation must not cover
// more than the operator saw. args must not use "db_count_cap".
func CountUpTo(ctx context.Context, q Querier, fromWhere string, args pgx.NamedArgs, most int64) (Total, error) {
	return countAtMost(ctx, q, fromWhere, args, most, -1)
}

// countAtMost counts up to most+1 rows; past most, N is est, or the
// planner's estimate when est < 0, never below most+1.
func countAtMost(ctx context.Context, q Querier, fromWhere string, args pgx.NamedArgs, most, est int64) (Total, error) {
	capped := pgx.NamedArgs{"db_count_cap": most + 1}
	for k, v := range args {
		capped[k] = v
	}
	var n int64
	if err := q.QueryRow(ctx, CountSQL(fromWhere), PlanEachCall, capped).Scan(&n); err != nil {
		return Total{}, fmt.Errorf("count: %w", err)
	}
	if n <= most {
		return Total{N: n}, nil
	}
	if est < 0 {
		var err error
		if est, err = EstimateRows(ctx, q, fromWhere, args); err != nil {
			return Total{}, err
		}
	}
	return Total{N: max(est, most+1), Estimate: true, MoreThan: most}, nil
}

// CountSQL is the capped count of CountTotal and CountUpTo, for plan
// tests: its cap is the parameter db_count_cap.
func CountSQL(fromWhere string) string {
	return `SELECT count(*) FROM (SELECT 1 FROM ` + fromWhere + ` LIMIT @db_count_cap) s`
}

// EstimateRows is the planner's row estimate for `SELECT 1 FROM
// <fromWhere>` (EXPLAIN: nothing is read).
func EstimateRows(ctx context.Context, q Querier, fromWhere string, args pgx.NamedArgs) (int64, error) {
	var plan []byte
	if err := q.QueryRow(ctx, `EXPLAIN (FORMAT JSON) SELECT 1 FROM `+fromWhere, PlanEachCall, args).Scan(&plan); err != nil {
		return 0, fmt.Errorf("estimate count: %w", err)
	}
	var explained []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(plan, &explained); err != nil || len(explained) == 0 {
		return 0, fmt.Errorf("estimate count: unreadable plan: %v", err)
	}
	return int64(explained[0].Plan.Rows), nil
}
