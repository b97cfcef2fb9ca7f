package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// appendAudit records n audit events, each in its own transaction.
func appendAudit(t *testing.T, pool *pgxpool.Pool, n int, reason string) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < n; i++ {
		err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
			return audit.Record(ctx, tx, audit.Event{Action: "outbox.retry", TargetID: fmt.Sprint(i), Reason: reason, Outcome: audit.OutcomeOK})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// testDB is a fresh, migrated database: its URL for the subcommand and a
// pool on it for the test.
func testDB(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url := dbtest.URL(t)
	pool, err := db.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return url, pool
}

// asOwner runs sql with the triggers off, as the tables' owner can.
func asOwner(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	ctx := context.Background()
	err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `ALTER TABLE audit_event DISABLE TRIGGER USER`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sql, args...); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `ALTER TABLE audit_event ENABLE TRIGGER USER`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Issue 10 item 10: deleting the newest rows, or rewriting the chain from
// some row on with valid hashes, leaves `audit verify` reporting an intact
// chain; `audit verify --anchors` fails naming the anchor.
func TestAuditVerifyWithAnchors(t *testing.T) {
	t.Parallel()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		tamper func(t *testing.T, pool *pgxpool.Pool, headSeq int64)
		want   string
	}{
		{"newest 50 rows deleted", func(t *testing.T, pool *pgxpool.Pool, head int64) {
			asOwner(t, pool, `DELETE FROM audit_event WHERE seq > $1`, head-50)
		}, "no longer holds seq"},
		{"rewritten from a row on, hashes recomputed", func(t *testing.T, pool *pgxpool.Pool, head int64) {
			// Delete from the 11th row on, rewind the sequence and append
			// different rows: every link and hash is valid again.
			asOwner(t, pool, `DELETE FROM audit_event WHERE seq > $1`, head-50)
			if _, err := pool.Exec(context.Background(), `SELECT setval(pg_get_serial_sequence('audit_event', 'seq'), $1)`, head-50); err != nil {
				t.Fatal(err)
			}
			appendAudit(t, pool, 50, "nothing happened")
		}, "rewritten"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			url, pool := testDB(t)
			file := filepath.Join(t.TempDir(), "anchors.jsonl")
			envs := map[string]string{"DATABASE_URL": url, "AUDIT_SIGNING_KEY": base64.StdEncoding.EncodeToString(key.Seed())}
			appendAudit(t, pool, 60, "")
			code, out, errOut := runConsole(t, envs, "audit", "anchor", "--out", file)
			if code != 0 || !strings.Contains(out, "appended to "+file) {
				t.Fatalf("anchor: exit %d %q %q", code, out, errOut)
			}
			var head int64
			if err := pool.QueryRow(context.Background(), `SELECT max(seq) FROM audit_event`).Scan(&head); err != nil {
				t.Fatal(err)
			}
			if code, out, errOut := runConsole(t, envs, "audit", "verify", "--anchors", file); code != 0 || !strings.Contains(out, "anchors: all 1 held") {
				t.Fatalf("intact chain with anchors: exit %d %q %q", code, out, errOut)
			}
			c.tamper(t, pool, head)
			if code, out, errOut := runConsole(t, envs, "audit", "verify"); code != 0 || !strings.Contains(out, "intact") {
				t.Fatalf("the tampering should fool the walk alone: exit %d %q %q", code, out, errOut)
			}
			code, _, errOut = runConsole(t, envs, "audit", "verify", "--anchors", file)
			if code != 1 || !strings.Contains(errOut, fmt.Sprintf("anchor on line 1 (seq %d", head)) || !strings.Contains(errOut, c.want) {
				t.Fatalf("tampered chain with anchors: exit %d, stderr %q", code, errOut)
			}
		})
	}
}

func TestAuditAnchorKeysAndForgery(t *testing.T) {
	t.Parallel()
	url, pool := testDB(t)
	appendAudit(t, pool, 3, "")
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signing := map[string]string{"DATABASE_URL": url, "AUDIT_SIGNING_KEY": base64.StdEncoding.EncodeToString(key)}
	code, line, errOut := runConsole(t, signing, "audit", "anchor")
	if code != 0 || !strings.HasPrefix(line, `{"seq":`) || strings.Count(line, "\n") != 1 {
		t.Fatalf("anchor to stdout: exit %d %q %q", code, line, errOut)
	}
	forged := strings.Replace(line, `"seq":`, `"seq":1`, 1) // claims another head, same signature
	file := filepath.Join(t.TempDir(), "anchors.jsonl")
	if err := os.WriteFile(file, []byte(line+forged), 0o644); err != nil {
		t.Fatal(err)
	}
	verifying := map[string]string{"DATABASE_URL": url, "AUDIT_VERIFY_KEY": base64.StdEncoding.EncodeToString(pub)}
	code, _, errOut = runConsole(t, verifying, "audit", "verify", "--anchors", file)
	if code != 1 || !strings.Contains(errOut, "anchor on line 2") || !strings.Contains(errOut, "does not verify") {
		t.Fatalf("forged anchor: exit %d, stderr %q", code, errOut)
	}
	if err := os.WriteFile(file, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := runConsole(t, verifying, "audit", "verify", "--anchors", file); code != 0 || !strings.Contains(out, "anchors: all 1") {
		t.Fatalf("genuine anchor with the public key: exit %d %q %q", code, out, errOut)
	}
	if code, _, errOut := runConsole(t, map[string]string{"DATABASE_URL": url}, "audit", "verify", "--anchors", file); code != 1 || !strings.Contains(errOut, "AUDIT_VERIFY_KEY") {
		t.Fatalf("no key: exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := runConsole(t, map[string]string{"DATABASE_URL": url, "AUDIT_SIGNING_KEY": "short"}, "audit", "anchor"); code != 1 || !strings.Contains(errOut, "AUDIT_SIGNING_KEY") {
		t.Fatalf("bad key: exit %d, stderr %q", code, errOut)
	}
}
