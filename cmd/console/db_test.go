package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// privileges lists role's table privileges and default privileges, to
// compare runs.
func privileges(t *testing.T, pool *pgxpool.Pool, role string) []string {
	t.Helper()
	rows, _ := pool.Query(context.Background(), `
		SELECT table_name || ':' || privilege_type FROM information_schema.role_table_grants WHERE grantee = $1
		UNION ALL
		SELECT 'default:' || defaclobjtype::text || ':' || array_to_string(defaclacl, ',') FROM pg_default_acl
		WHERE array_to_string(defaclacl, ',') LIKE '%' || $1 || '=%'
		ORDER BY 1`, role)
	p, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDBGrantDryRunThenIdempotent(t *testing.T) {
	t.Parallel()
	url, pool := testDB(t)
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	role := "sluice_grant_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = pool.Exec(ctx, `DROP OWNED BY `+role)
		if _, err := pool.Exec(ctx, `DROP ROLE IF EXISTS `+role); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	envs := map[string]string{"DATABASE_URL": url}
	roleExists := func() bool {
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)`, role).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}

	code, out, errOut := runConsole(t, envs, "db", "grant", "--role", role, "--dry-run")
	if code != 0 || !strings.Contains(out, "CREATE ROLE "+`"`+role+`"`) || !strings.Contains(out, `GRANT SELECT, INSERT ON TABLE "audit_event", "ledger_entry"`) ||
		!strings.Contains(out, "ALTER DEFAULT PRIVILEGES") {
		t.Fatalf("dry run: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if roleExists() {
		t.Fatal("the dry run created the role")
	}
	var recorded int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM db_app_role`).Scan(&recorded); err != nil || recorded != 0 {
		t.Fatalf("the dry run recorded the role: %d %v", recorded, err)
	}

	code, out, errOut = runConsole(t, envs, "db", "grant", "--role", role)
	if code != 0 || !strings.Contains(out, "created role "+role) || !roleExists() {
		t.Fatalf("first grant: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	first := privileges(t, pool, role)
	code, out, errOut = runConsole(t, envs, "db", "grant", "--role", role)
	if code != 0 || strings.Contains(out, "created role") {
		t.Fatalf("second grant: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if second := privileges(t, pool, role); strings.Join(first, " ") != strings.Join(second, " ") {
		t.Fatalf("second grant changed privileges:\n%v\n%v", first, second)
	}
	want := map[string]bool{"audit_event:INSERT": true, "audit_event:SELECT": true, "outbox_event:UPDATE": true, "goose_db_version:SELECT": true}
	var defaults int
	for _, p := range first {
		delete(want, p)
		if strings.HasPrefix(p, "default:") {
			defaults++
		}
		if strings.HasPrefix(p, "audit_event:") && p != "audit_event:INSERT" && p != "audit_event:SELECT" ||
			strings.HasPrefix(p, "ledger_entry:") && p != "ledger_entry:INSERT" && p != "ledger_entry:SELECT" ||
			strings.HasPrefix(p, "db_app_role:") {
			t.Errorf("unexpected privilege %s", p)
		}
	}
	if len(want) > 0 || defaults != 2 {
		t.Fatalf("missing privileges %v or default privileges (%d) in %v", want, defaults, first)
	}

	if code, _, errOut := runConsole(t, envs, "db", "grant"); code != 1 || !strings.Contains(errOut, "DB_APP_ROLE") {
		t.Fatalf("no role: exit %d, stderr %q", code, errOut)
	}
	if code, _, _ := runConsole(t, envs, "db", "revoke", "--role", role); code != 2 {
		t.Fatalf("unknown verb: exit %d", code)
	}
}
