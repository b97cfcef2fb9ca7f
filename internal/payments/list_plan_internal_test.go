package payments

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/shopspring/decimal"

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

// The list's pages and its count are planned for their filter's values on
// every call (db.PlanEachCall): none is kept as a prepared statement, whose
// generic plan PostgreSQL may switch to after five runs (a plan for no
// amount in particular).
func TestListIsPlannedForItsValues(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		INSERT INTO account (account_id, currency, balance) VALUES (1, 'TRY', 1000000000);
		INSERT INTO payment (operation_id, merchant_id, invoice_id, account_id, amount, currency, status, unknown_since, created_at, updated_at)
		SELECT gen_random_uuid(), 'm' || (g % 5), 'inv-' || g, 1, g % 100 + 1, 'TRY',
		       CASE WHEN g % 10 = 0 THEN 'unknown' WHEN g % 3 = 0 THEN 'failed' ELSE 'completed' END,
		       CASE WHEN g % 10 = 0 THEN now() - g * interval '1 second' END, now() - g * interval '1 second', now()
		  FROM generate_series(1, 2000) g`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// The seeding may have prepared statements on this connection.
	if err := conn.Conn().DeallocateAll(ctx); err != nil {
		t.Fatal(err)
	}
	for _, amin := range []int64{1, 50, 99, 100, 1000, 7, 3} {
		f := Filter{AmountMin: decimal.NewFromInt(amin), MerchantID: "m" + fmt.Sprint(amin%5)}
		if _, err := ListPayments(ctx, conn, f, Page{Limit: 5}); err != nil {
			t.Fatal(err)
		}
		if _, err := CountPayments(ctx, conn, f); err != nil {
			t.Fatal(err)
		}
	}
	if stmts := dbtest.Prepared(t, conn, "payment"); len(stmts) > 0 {
		t.Fatalf("kept as prepared statements (a generic plan may serve them):\n%s", strings.Join(stmts, "\n"))
	}
}
