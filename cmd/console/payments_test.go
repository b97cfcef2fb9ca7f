package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
)

// `console payments reconcile --file F [--dry-run]`: a file with an invalid
// line or no lines applies nothing and exits 1 naming the line; --dry-run
// prints what would change and changes nothing; the real run settles the
// unknown payment; a charge we have no payment for exits 1.
func TestPaymentsReconcileFile(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	ctx := context.Background()
	pool, err := db.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	account := paymentstest.Account(t, pool, paymentstest.AccountOpts{ID: 1, Balance: "500"})
	op := paymentstest.Payment(t, pool, paymentstest.PaymentOpts{Account: account, Invoice: "inv-1", Amount: "100"})
	state := func() string {
		t.Helper()
		var s string
		if err := pool.QueryRow(ctx, `SELECT concat_ws(' ', p.status, a.balance, a.reserved, (SELECT count(*) FROM ledger_entry), (SELECT count(*) FROM outbox_event))
			FROM payment p JOIN account a USING (account_id)`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	envs := map[string]string{"DATABASE_URL": url}
	before := state()

	bad := write("bad.csv", "operation_id,outcome,provider_ref\n"+op.String()+",succeeded,ref-9\nnot-a-uuid,failed\n")
	code, out, stderr := runConsole(t, envs, "payments", "reconcile", "--file", bad)
	if code != 1 || !strings.Contains(stderr, "line 3") || strings.Count(stderr, "\n") != 1 || !strings.Contains(out, "line 3\tinvalid") {
		t.Fatalf("invalid line: code %d\nstdout %s\nstderr %s", code, out, stderr)
	}
	if s := state(); s != before {
		t.Fatalf("an invalid file changed the database: %s → %s", before, s)
	}
	if code, _, stderr := runConsole(t, envs, "payments", "reconcile", "--file", write("empty.csv", "\xef\xbb\xbfoperation_id,outcome\n")); code != 1 || !strings.Contains(stderr, "no settlement lines") {
		t.Fatalf("empty file: code %d stderr %s", code, stderr)
	}

	good := write("eod.csv", "\xef\xbb\xbfoperation_id,outcome,provider_ref\n"+op.String()+",succeeded,ref-9\n")
	code, out, stderr = runConsole(t, envs, "payments", "reconcile", "--file", good, "--dry-run")
	if code != 0 || !strings.Contains(out, "dry run") || !strings.Contains(out, "would resolve unknown → completed") {
		t.Fatalf("dry run: code %d\nstdout %s\nstderr %s", code, out, stderr)
	}
	if s := state(); s != before {
		t.Fatalf("--dry-run changed the database: %s → %s", before, s)
	}
	code, out, stderr = runConsole(t, envs, "payments", "reconcile", "--file", good)
	if code != 0 || !strings.Contains(out, "summary: 1 line(s), resolved 1") {
		t.Fatalf("apply: code %d\nstdout %s\nstderr %s", code, out, stderr)
	}
	// Two ledger entries: the opening credit and the payment's debit.
	if s := state(); !strings.HasPrefix(s, "completed 400.00 0.00 2 ") {
		t.Fatalf("after reconcile: %s", s)
	}
	applied := state()
	if code, out, _ := runConsole(t, envs, "payments", "reconcile", "--file", good, "--actor", "ops-bot"); code != 0 || !strings.Contains(out, "agreed 1") || state() != applied {
		t.Fatalf("second application: code %d %s %s", code, out, state())
	}
	// One audit row for the settled payment, naming the file's hash and
	// the OS user@host (the second application settled nothing).
	sum := sha256.Sum256([]byte("\xef\xbb\xbfoperation_id,outcome,provider_ref\n" + op.String() + ",succeeded,ref-9\n"))
	var n int
	var actor string
	if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(max(actor_name), '') FROM audit_event WHERE action = 'payments.settle' AND target_type = 'payment'
		AND target_id = $1 AND outcome = 'ok' AND evidence = $2`, op.String(), "settlement sha256:"+hex.EncodeToString(sum[:])+" line 2").Scan(&n, &actor); err != nil {
		t.Fatal(err)
	}
	if n != 1 || !strings.Contains(actor, "@") {
		t.Fatalf("%d settle audit rows naming the hash, actor %q; want 1 by user@host", n, actor)
	}

	stranger := write("stranger.csv", uuid.NewString()+",succeeded\n")
	if code, out, stderr := runConsole(t, envs, "payments", "reconcile", "--file", stranger); code != 1 || !strings.Contains(out, "not_found") || !strings.Contains(stderr, "no payment of ours") {
		t.Fatalf("not_found: code %d\nstdout %s\nstderr %s", code, out, stderr)
	}
	// The charge with no payment of ours is recorded: its audit row, by
	// whoever ran the command.
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM audit_event WHERE action = 'payments.settle_not_found' AND outcome = 'ok'
		AND target_type = 'payment' AND actor_name LIKE '%@%' AND evidence LIKE 'settlement sha256:% line 1'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d audit rows of the line naming no payment (%v), want 1", n, err)
	}
	if code, _, _ := runConsole(t, envs, "payments", "reconcile"); code != 1 {
		t.Fatalf("missing --file: code %d", code)
	}
	if code, _, _ := runConsole(t, nil, "payments", "frobnicate"); code != 2 {
		t.Fatalf("unknown action: code %d", code)
	}
}
