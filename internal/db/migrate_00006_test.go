package db_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// A database that already holds accounts and payments (a completed one and
// a failed one) migrates to 00006: payments become attempt 1, accounts have
// no owner, and the new business identity holds — a second live attempt of
// a paid invoice is refused, a retry of the failed invoice is allowed.
func TestMigration00006KeepsExistingPayments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbtest.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := db.OpenConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, os.DirFS("migrations"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 5); err != nil {
		t.Fatalf("migrate to 5: %v", err)
	}
	for _, q := range []string{
		`INSERT INTO account (account_id, balance) VALUES (1, 100)`,
		`INSERT INTO payment (operation_id, merchant_id, invoice_id, account_id, amount, currency, status)
		 VALUES ('00000000-0000-0000-0000-000000000001', 'm', 'paid', 1, 10, 'TRY', 'completed'),
		        ('00000000-0000-0000-0000-000000000002', 'm', 'declined', 1, 10, 'TRY', 'failed')`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrate a database with payments: %v", err)
	}
	var attempts, owned int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE attempt = 1), (SELECT count(*) FROM account WHERE merchant_id IS NOT NULL) FROM payment`).Scan(&attempts, &owned); err != nil {
		t.Fatal(err)
	}
	if attempts != 2 || owned != 0 {
		t.Fatalf("after 00006: %d payments at attempt 1 (want 2), %d owned accounts (want 0)", attempts, owned)
	}
	_, err = pool.Exec(ctx, `INSERT INTO payment (operation_id, merchant_id, invoice_id, account_id, amount, currency, status, attempt)
		VALUES ('00000000-0000-0000-0000-000000000003', 'm', 'paid', 1, 10, 'TRY', 'processing', 2)`)
	if db.Code(err) != db.CodeUniqueViolation || db.Constraint(err) != "payment_business_identity" {
		t.Fatalf("a second live attempt of a paid invoice: %v, want payment_business_identity violated", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO payment (operation_id, merchant_id, invoice_id, account_id, amount, currency, status, attempt)
		VALUES ('00000000-0000-0000-0000-000000000004', 'm', 'declined', 1, 10, 'TRY', 'processing', 2)`); err != nil {
		t.Fatalf("attempt 2 of a declined invoice: %v", err)
	}
}
