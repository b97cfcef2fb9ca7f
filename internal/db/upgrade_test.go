package db_test

import (
	"context"
	"testing"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// releasedVersion is the newest migration of the last release. Migrations
// after it must take a database made by that release, with rows in it, to
// the current schema without losing a row.
const releasedVersion = 5

func TestDatabaseOfTheLastReleaseMigratesWithItsRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := db.Open(ctx, dbtest.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := db.MigrateTo(ctx, pool, releasedVersion); err != nil {
		t.Fatalf("migrate to the released version %d: %v", releasedVersion, err)
	}
	// Rows as the released code wrote them (this test owns no table; it
	// stands in for a database in the field, so it writes raw SQL).
	for _, stmt := range []string{
		`INSERT INTO account (account_id, currency, balance, reserved) VALUES (7, 'TRY', 100, 10)`,
		`INSERT INTO payment (operation_id, merchant_id, invoice_id, account_id, amount, currency, status)
		 VALUES ('0190f000-0000-7000-8000-000000000001', 'm1', 'inv-1', 7, 10, 'TRY', 'unknown'),
		        ('0190f000-0000-7000-8000-000000000002', 'm1', 'inv-2', 7, 5, 'TRY', 'failed')`,
		`INSERT INTO idempotency_record (merchant_id, idempotency_key, request_hash, status, operation_id)
		 VALUES ('m1', 'k1', 'h', 'unknown', '0190f000-0000-7000-8000-000000000001')`,
		`INSERT INTO balance_reservation (operation_id, account_id, amount, status)
		 VALUES ('0190f000-0000-7000-8000-000000000001', 7, 10, 'active')`,
		`INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload)
		 VALUES ('0190f000-0000-7000-8000-0000000000aa', 'order', 'o1', 1, 'orders', 'order.created.v1', '{}')`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("seed the released schema: %v\n%s", err, stmt)
		}
	}
	if _, err := db.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrate a released database with rows to the current schema: %v", err)
	}
	if err := db.CheckSchema(ctx, pool); err != nil {
		t.Fatalf("after migrating: %v", err)
	}
	for table, want := range map[string]int{"account": 1, "payment": 2, "idempotency_record": 1, "balance_reservation": 1, "outbox_event": 1} {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Errorf("%s has %d rows after migrating, want %d", table, n, want)
		}
	}
	var status, balance string
	if err := pool.QueryRow(ctx, `SELECT p.status, a.balance::text FROM payment p JOIN account a USING (account_id)
		WHERE p.operation_id = '0190f000-0000-7000-8000-000000000001'`).Scan(&status, &balance); err != nil {
		t.Fatal(err)
	}
	if status != "unknown" || balance != "100.00" {
		t.Errorf("payment status %q, balance %s after migrating; want unknown, 100.00", status, balance)
	}
}
