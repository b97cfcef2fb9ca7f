package db_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/outbox"
)

type nopPublisher struct{ n int }

func (p *nopPublisher) Publish(context.Context, broker.Message) error { p.n++; return nil }

func recordAs(t *testing.T, pool *pgxpool.Pool, action string) {
	t.Helper()
	ctx := context.Background()
	if err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		return audit.Record(ctx, tx, audit.Event{Action: action, Outcome: audit.OutcomeOK})
	}); err != nil {
		t.Fatalf("audit.Record as %s: %v", pool.Config().ConnConfig.User, err)
	}
}

// Issue 10 item 10, SECURITY.md case 11: as the application role the trails
// cannot be edited, emptied, unprotected or dropped, by grants (the owner
// could disable the triggers; this role cannot), while what the services
// do still works.
func TestAppRoleCannotRewriteTheTrails(t *testing.T) {
	t.Parallel()
	owner := dbtest.New(t)
	app := dbtest.AppRole(t, owner)
	ctx := context.Background()
	if _, err := owner.Exec(ctx, `INSERT INTO account (account_id, balance) VALUES (1, 100)`); err != nil {
		t.Fatal(err)
	}
	recordAs(t, app, "outbox.retry")
	recordAs(t, app, "outbox.retry")
	if _, err := app.Exec(ctx, `INSERT INTO ledger_entry (operation_id, account_id, entry_type, amount, currency)
		VALUES (gen_random_uuid(), 1, 'debit', 5, 'EUR')`); err != nil {
		t.Fatalf("ledger insert as the application role: %v", err)
	}
	var n int
	if err := app.QueryRow(ctx, `SELECT (SELECT count(*) FROM audit_event) + (SELECT count(*) FROM ledger_entry)`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("select as the application role: %d rows, %v", n, err)
	}
	for _, table := range db.AppendOnlyTables {
		for _, sql := range []string{
			`UPDATE ` + table + ` SET created_at = now()`,
			`DELETE FROM ` + table,
			`TRUNCATE ` + table,
			`ALTER TABLE ` + table + ` DISABLE TRIGGER USER`,
			`ALTER TABLE ` + table + ` OWNER TO CURRENT_USER`,
			`DROP TABLE ` + table,
			`CREATE TRIGGER sneak BEFORE INSERT ON ` + table + ` FOR EACH ROW EXECUTE FUNCTION sluice_refuse_change()`,
		} {
			if table == "audit_event" {
				sql = replaceColumn(sql)
			}
			_, err := app.Exec(ctx, sql)
			if code := db.Code(err); code != db.CodeInsufficientPriv {
				t.Errorf("%s as the application role: SQLSTATE %q (%v), want %s", sql, code, err, db.CodeInsufficientPriv)
			}
		}
	}
	// Nor can it switch triggers off for its session, or make tables.
	for _, sql := range []string{`SET session_replication_role = replica`, `CREATE TABLE mine (x int)`} {
		if _, err := app.Exec(ctx, sql); db.Code(err) != db.CodeInsufficientPriv {
			t.Errorf("%s as the application role: %v, want %s", sql, err, db.CodeInsufficientPriv)
		}
	}
	if res, err := audit.Verify(ctx, app); err != nil || !res.Intact() || res.Checked != 2 {
		t.Fatalf("chain after the attempts: %+v %v", res, err)
	}

	// What the services do elsewhere still works: write an event in a
	// business transaction, relay it, read the backlog, check the schema.
	err := db.WithTx(ctx, app, func(tx pgx.Tx) error {
		_, err := outbox.Insert(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "o1", Topic: "orders",
			EventType: "order.placed.v1", Payload: json.RawMessage(`{"n":1}`)})
		return err
	})
	if err != nil {
		t.Fatalf("outbox.Insert as the application role: %v", err)
	}
	pub := &nopPublisher{}
	relay, err := outbox.NewRelay(app, pub, outbox.RelayConfig{DisableListen: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := relay.RunOnce(ctx)
	if err != nil || res.Published != 1 || pub.n != 1 {
		t.Fatalf("relay batch as the application role: %+v %v", res, err)
	}
	// The backlog counts (migration 00021): written by the insert trigger
	// and the relay's mark, compacted and recounted by the services.
	if _, err := outbox.CompactBacklogCounts(ctx, app); err != nil {
		t.Fatalf("compact the backlog counts as the application role: %v", err)
	}
	if pending, dead, err := outbox.RecountBacklog(ctx, app); err != nil || pending != 0 || dead != 0 {
		t.Fatalf("recount the backlog as the application role: %d pending, %d dead, %v", pending, dead, err)
	}
	if b, err := outbox.ReadBacklog(ctx, app); err != nil || b.Pending != 0 {
		t.Fatalf("backlog as the application role: %+v %v", b, err)
	}
	if err := db.CheckSchema(ctx, app); err != nil {
		t.Fatalf("schema check as the application role: %v", err)
	}
	if _, err := app.Exec(ctx, `UPDATE goose_db_version SET is_applied = true`); db.Code(err) != db.CodeInsufficientPriv {
		t.Errorf("the application role may write the schema version: %v", err)
	}
}

// audit_event has no created_at: its statements name a column it has.
func replaceColumn(sql string) string {
	if sql == `UPDATE audit_event SET created_at = now()` {
		return `UPDATE audit_event SET reason = 'x'`
	}
	return sql
}

// Migrate re-applies the grants of recorded application roles: a table a
// later migration adds is usable, and a privilege added by hand on a trail
// is taken back.
func TestMigrateKeepsTheAppRoleGrants(t *testing.T) {
	t.Parallel()
	owner := dbtest.New(t)
	app := dbtest.AppRole(t, owner)
	ctx := context.Background()
	role := app.Config().ConnConfig.User
	if _, err := owner.Exec(ctx, `GRANT UPDATE, DELETE ON audit_event TO `+role); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(ctx, `CREATE TABLE later_table (id bigserial PRIMARY KEY, note text)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Migrate(ctx, owner); err != nil {
		t.Fatal(err)
	}
	if _, err := app.Exec(ctx, `INSERT INTO later_table (note) VALUES ('x')`); err != nil {
		t.Errorf("a table added after the grant is not usable: %v", err)
	}
	if _, err := app.Exec(ctx, `DELETE FROM audit_event`); db.Code(err) != db.CodeInsufficientPriv {
		t.Errorf("a DELETE granted by hand survived migrate: %v", err)
	}
	var privs []string
	rows, _ := owner.Query(ctx, `SELECT privilege_type FROM information_schema.role_table_grants
		WHERE grantee = $1 AND table_name = 'audit_event' ORDER BY 1`, role)
	privs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(privs) != 2 || privs[0] != "INSERT" || privs[1] != "SELECT" {
		t.Fatalf("audit_event privileges of the application role: %v %v", privs, err)
	}
}

// The owner itself, and a superuser, are refused as application roles.
func TestGrantRefusesAnOwnerOrSuperuser(t *testing.T) {
	t.Parallel()
	owner := dbtest.New(t)
	ctx := context.Background()
	var me string
	if err := owner.QueryRow(ctx, `SELECT current_user`).Scan(&me); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Grant(ctx, owner, me); !errors.Is(err, db.ErrGrant) {
		t.Fatalf("grant to the owner: %v, want ErrGrant", err)
	}
	if _, err := db.PlanGrant(ctx, owner, ""); !errors.Is(err, db.ErrGrant) {
		t.Fatalf("empty role name: %v", err)
	}
}
