package db

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// CountExactBelow is where the list pages stop counting and estimate: an
// exact count reads at most this many index entries plus one.
const CountExactBelow = 10_000

// Total is how many rows match a list's filter.
type Total struct {
	N        int64
	Estimate bool // N is the planner's estimate: more than CountExactBelow matched
}

// CountTotal is CountOrEstimate at CountExactBelow, as a Total.
func CountTotal(ctx context.Context, q Querier, fromWhere string, args pgx.NamedArgs) (Total, error) {
	n, est, err := CountOrEstimate(ctx, q, fromWhere, args, CountExactBelow)
	return Total{N: n, Estimate: est}, err
}

// CountOrEstimate counts the rows of `SELECT 1 FROM <fromWhere>` exactly up
// to exactBelow (a count over a LIMIT'd subquery, so it reads at most that
// many rows plus one); above that it returns the planner's row estimate
// (EXPLAIN: nothing read), never less than exactBelow+1, with estimate set.
// The list pages' headers use it: tens of millions of rows are never
// counted for a page. args must not use the name "db_count_cap".
func CountOrEstimate(ctx context.Context, q Querier, fromWhere string, args pgx.NamedArgs, exactBelow int64) (n int64, estimate bool, err error) {
	capped := pgx.NamedArgs{"db_count_cap": exactBelow + 1}
	for k, v := range args {
		capped[k] = v
	}
	if err := q.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+fromWhere+` LIMIT @db_count_cap) s`, capped).Scan(&n); err != nil {
		return 0, false, fmt.Errorf("count: %w", err)
	}
	if n <= exactBelow {
		return n, false, nil
	}
	var plan []byte
	if err := q.QueryRow(ctx, `EXPLAIN (FORMAT JSON) SELECT 1 FROM `+fromWhere, args).Scan(&plan); err != nil {
		return 0, false, fmt.Errorf("estimate count: %w", err)
	}
	var explained []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(plan, &explained); err != nil || len(explained) == 0 {
		return 0, false, fmt.Errorf("estimate count: unreadable plan: %v", err)
	}
	return max(int64(explained[0].Plan.Rows), exactBelow+1), true, nil
}
