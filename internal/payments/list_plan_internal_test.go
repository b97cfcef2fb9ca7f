package payments

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// The payments list stays an index walk on a large table: each status
// segment reads its own index in the list's order, on the first page and on
// a page deep in the history alike (no sort, no sequential scan). The
// timing belongs to bench/; the plan is what a test can hold.
func TestListPlansWalkIndexesOnALargeTable(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	const rows = 300_000 // 1M takes minutes to generate on 2 cores; the plans are the same shape
	if _, err := pool.Exec(ctx, `INSERT INTO account (account_id, currency, balance) VALUES (1, 'TRY', 1000000000)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO payment (operation_id, merchant_id, invoice_id, account_id, amount, currency, status, unknown_since, created_at, updated_at)
		SELECT gen_random_uuid(), 'm' || (g % 50), 'inv-' || g, 1, 10, 'TRY',
		       CASE WHEN g % 1000 = 0 THEN 'unknown' WHEN g % 10 = 0 THEN 'failed' ELSE 'completed' END,
		       CASE WHEN g % 1000 = 0 THEN now() - g * interval '1 second' END,
		       now() - g * interval '1 second', now()
		  FROM generate_series(1, $1) g`, rows); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE payment`); err != nil {
		t.Fatal(err)
	}
	deep := &cursor{at: time.Now().Add(-200_000 * time.Second), op: uuid.Max}
	for _, c := range []struct {
		name   string
		f      Filter
		status Status
		after  *cursor
	}{
		{"unknown, first page", Filter{}, StatusUnknown, nil},
		{"completed, first page", Filter{}, StatusCompleted, nil},
		{"completed, deep page", Filter{}, StatusCompleted, deep},
		{"failed, deep page", Filter{}, StatusFailed, deep},
		{"merchant, deep page", Filter{MerchantID: "m7"}, StatusCompleted, deep},
	} {
		sql, args := segmentSQL(c.f, c.status, c.after, 51)
		rows, err := pool.Query(ctx, "EXPLAIN "+sql, args)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(lines, "\n")
		if strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Sort") || !strings.Contains(plan, "Index") {
			t.Errorf("%s: the plan does not walk an index in the list's order:\n%s", c.name, plan)
		}
	}
}
