package db

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// CountUpTo counts the rows of `SELECT 1 FROM <from>` (from is a FROM list
// with its WHERE clause, args its named parameters): exactly up to exact (a
// count over a LIMIT'd subquery, so it reads at most exact+1 rows); above
// that the planner's row estimate (EXPLAIN, nothing read), never less than
// exact+1, with estimate true. A page header never counts millions of rows.
func CountUpTo(ctx context.Context, q Querier, from string, args pgx.NamedArgs, exact int64) (n int64, estimate bool, err error) {
	capped := pgx.NamedArgs{"count_cap": exact + 1}
	for k, v := range args {
		capped[k] = v
	}
	if err := q.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+from+` LIMIT @count_cap) s`, capped).Scan(&n); err != nil {
		return 0, false, err
	}
	if n <= exact {
		return n, false, nil
	}
	var plan []byte
	if err := q.QueryRow(ctx, `EXPLAIN (FORMAT JSON) SELECT 1 FROM `+from, args).Scan(&plan); err != nil {
		return 0, false, fmt.Errorf("estimate: %w", err)
	}
	var explained []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(plan, &explained); err != nil || len(explained) == 0 {
		return 0, false, fmt.Errorf("estimate: unreadable plan: %v", err)
	}
	return max(int64(explained[0].Plan.Rows), exact+1), true, nil
}
