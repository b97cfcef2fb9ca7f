package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

func TestAuditVerifyNamesTheFirstBrokenRow(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	ctx := context.Background()
	pool, err := db.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	envs := map[string]string{"DATABASE_URL": url}
	if code, out, errOut := runConsole(t, envs, "audit", "verify"); code != 0 || !strings.Contains(out, "intact: 0 rows") {
		t.Fatalf("empty chain: %d %q %q", code, out, errOut)
	}
	var seqs []int64
	for i := 0; i < 3; i++ {
		err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
			return audit.Record(ctx, tx, audit.Event{Action: "outbox.retry", TargetID: fmt.Sprint(i), Outcome: audit.OutcomeOK})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	rows, _ := pool.Query(ctx, `SELECT seq FROM audit_event ORDER BY seq`)
	if seqs, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := runConsole(t, envs, "audit", "verify"); code != 0 || !strings.Contains(out, "intact: 3 rows") {
		t.Fatalf("intact chain: %d %q", code, out)
	}
	err = db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE audit_event SET target_id = 'other' WHERE seq = $1`, seqs[1])
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runConsole(t, envs, "audit", "verify")
	if code != 1 || !strings.Contains(errOut, fmt.Sprintf("seq %d", seqs[1])) {
		t.Fatalf("edited chain: exit %d, stderr %q", code, errOut)
	}
	if code, _, _ := runConsole(t, envs, "audit", "check"); code != 2 {
		t.Fatalf("unknown action: exit %d", code)
	}
}

func TestServeRefusesBadConfig(t *testing.T) {
	t.Parallel()
	base := map[string]string{
		"DATABASE_URL": "postgres://u@127.0.0.1:1/x", "OIDC_ISSUER": "https://idp.example", "OIDC_CLIENT_ID": "c",
		"OIDC_CLIENT_SECRET": "s", "CONSOLE_ROLE_MAP": "sre:admin",
	}
	for name, c := range map[string]struct{ key, val, want string }{
		"no issuer":          {"OIDC_ISSUER", "", "OIDC_ISSUER"},
		"bad role map":       {"CONSOLE_ROLE_MAP", "sre:root", "CONSOLE_ROLE_MAP"},
		"plain http":         {"CONSOLE_PUBLIC_URL", "http://console.example", "CONSOLE_PUBLIC_URL"},
		"public url w/ path": {"CONSOLE_PUBLIC_URL", "https://console.example/x", "CONSOLE_PUBLIC_URL"},
		"bad idle":           {"CONSOLE_SESSION_IDLE", "soon", "CONSOLE_SESSION_IDLE"},
		"http issuer":        {"OIDC_ISSUER", "http://idp.example", "OIDC_ISSUER"},
		"anchors, no key":    {"AUDIT_ANCHOR_FILE", "/nonexistent/anchors.jsonl", "AUDIT_SIGNING_KEY"},
	} {
		envs := map[string]string{}
		for k, v := range base {
			envs[k] = v
		}
		envs[c.key] = c.val
		code, _, errOut := runConsole(t, envs, "serve")
		if code != 1 || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: exit %d, stderr %q", name, code, errOut)
		}
	}
}
