package payments

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// The approvals page reads each request's payment (its invoice, amount and
// status now) in the statement that lists the requests: the plan walks the
// pending requests' index in the list's order and looks each payment up by
// its primary key, among many payments and many decided requests (no scan
// of either table, no sort, no query per row).
func TestPendingApprovalsPlanReadsPaymentsByKey(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		INSERT INTO account (account_id, currency, balance) VALUES (1, 'TRY', 1000000000);
		INSERT INTO payment (operation_id, merchant_id, invoice_id, account_id, amount, currency, status, unknown_since)
		SELECT gen_random_uuid(), 'm' || (g % 50), 'inv-' || g, 1, 500, 'TRY',
		       CASE WHEN g % 100 = 0 THEN 'unknown' ELSE 'completed' END, CASE WHEN g % 100 = 0 THEN now() END
		  FROM generate_series(1, 100000) g;
		-- Decided requests of completed payments, and pending ones of the unknown.
		INSERT INTO payment_approval (operation_id, outcome, reason, evidence, requested_by, state, decided_by, decided_at)
		SELECT operation_id, 'succeeded', 'r', 'e', 'a', 'approved', 'b', now() FROM payment WHERE status = 'completed' LIMIT 20000;
		INSERT INTO payment_approval (operation_id, outcome, reason, evidence, requested_by)
		SELECT operation_id, 'succeeded', 'r', 'e', 'a' FROM payment WHERE status = 'unknown' LIMIT 300;
		ANALYZE payment; ANALYZE payment_approval`); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, "EXPLAIN "+pendingApprovalsSQL, 200)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	plan := strings.Join(lines, "\n")
	for _, want := range []string{"payment_approval_pending_idx", "payment_pkey", "Nested Loop"} {
		if !strings.Contains(plan, want) {
			t.Errorf("the plan has no %s:\n%s", want, plan)
		}
	}
	if strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Sort") {
		t.Errorf("the plan scans a table or sorts:\n%s", plan)
	}
	got, err := PendingApprovals(ctx, pool, 200)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 200 || got[0].InvoiceID == "" || got[0].MerchantID == "" || got[0].PaymentStatus != StatusUnknown || got[0].Amount.String() != "500" {
		t.Fatalf("%d requests, the first %+v: want 200 with their payment's invoice, merchant, amount and status", len(got), got[0])
	}
}
