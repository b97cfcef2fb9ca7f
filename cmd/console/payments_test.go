package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// `console payments reconcile --file F` resolves an unknown payment from a
// settlement line, reports a bad line, and exits 1 because of it.
func TestPaymentsReconcileFile(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	ctx := context.Background()
	pool, err := db.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	op := uuid.New()
	for _, q := range []string{
		`INSERT INTO account (account_id, currency, balance, reserved) VALUES (1, 'TRY', 500, 100)`,
		`INSERT INTO payment (operation_id, merchant_id, invoice_id, account_id, amount, currency, status, unknown_since) VALUES ('` + op.String() + `', 'm', 'inv-1', 1, 100, 'TRY', 'unknown', now())`,
		`INSERT INTO balance_reservation (operation_id, account_id, amount) VALUES ('` + op.String() + `', 1, 100)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(t.TempDir(), "eod.csv")
	if err := os.WriteFile(file, []byte("operation_id,outcome,provider_ref\n"+op.String()+",succeeded,ref-9\nnot-a-uuid,failed\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := runConsole(t, map[string]string{"DATABASE_URL": url}, "payments", "reconcile", "--file", file)
	if code != 1 || !strings.Contains(out, "resolved") || !strings.Contains(out, "invalid") || !strings.Contains(out, "summary: 2 line(s)") {
		t.Fatalf("code %d\nstdout %s\nstderr %s", code, out, stderr)
	}
	var status, balance, reserved string
	if err := pool.QueryRow(ctx, `SELECT p.status, a.balance::text, a.reserved::text FROM payment p JOIN account a USING (account_id)`).Scan(&status, &balance, &reserved); err != nil {
		t.Fatal(err)
	}
	if status != "completed" || balance != "400.00" || reserved != "0.00" {
		t.Fatalf("after reconcile: %s balance %s reserved %s", status, balance, reserved)
	}
	if code, _, _ := runConsole(t, map[string]string{"DATABASE_URL": url}, "payments", "reconcile"); code != 1 {
		t.Fatalf("missing --file: code %d", code)
	}
	if code, _, _ := runConsole(t, nil, "payments", "frobnicate"); code != 2 {
		t.Fatalf("unknown action: code %d", code)
	}
}
