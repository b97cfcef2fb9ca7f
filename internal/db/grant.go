package db

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The services run as an application role that owns nothing: a table's
// owner can disable its triggers, rewrite it and drop it, so a service
// running as the owner could edit the audit trail and recompute its hashes.
// The role that runs migrations owns the tables; Grant gives the
// application role exactly the DML the code needs, and on the append-only
// trails only INSERT and SELECT (their triggers refuse the rest even to the
// owner, but the owner may disable triggers, the application role may not).

// AppendOnlyTables are the trails the application role may only append to
// and read.
var AppendOnlyTables = []string{"audit_event", "ledger_entry"}

// readOnlyTables the application role may read but not write: the schema
// version that start-up and /readyz check.
var readOnlyTables = []string{"goose_db_version"}

// hiddenTables the application role gets no privilege on.
var hiddenTables = []string{"db_app_role"}

// ErrGrant reports why the application role cannot be set up safely.
var ErrGrant = errors.New("db grant")

// GrantPlan is what Grant does (or, in a dry run, would do).
type GrantPlan struct {
	Role       string
	Owner      string // the role that owns the tables (runs migrations)
	CreateRole bool   // the role does not exist yet and will be created
	Statements []string
}

// SQL is the plan as a script, one statement per line.
func (p GrantPlan) SQL() string {
	var b strings.Builder
	for _, s := range p.Statements {
		b.WriteString(s)
		b.WriteString(";\n")
	}
	return b.String()
}

// PlanGrant works out the statements that make role the application role of
// the database q is connected to, and refuses (ErrGrant) a role that would
// not be safe: a superuser, the owner of a table or a member of an owner.
// It changes nothing. Run it as the role that runs migrations.
func PlanGrant(ctx context.Context, q Querier, role string) (GrantPlan, error) {
	if role == "" || len(role) > 63 {
		return GrantPlan{}, fmt.Errorf("%w: role name must be 1–63 bytes", ErrGrant)
	}
	p := GrantPlan{Role: role}
	var (
		schema, me              string
		meSuper, meCreateRole   bool
		exists, super, inOwners bool
		owners                  []string
		tables                  []string
		ownerOK                 bool
		owner                   *string
	)
	err := q.QueryRow(ctx, `
		WITH t AS (
			SELECT c.relname, pg_get_userbyid(c.relowner) AS owner
			FROM pg_class c
			WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
		), r AS (SELECT oid, rolsuper FROM pg_roles WHERE rolname = $1)
		SELECT current_schema(), current_user, me.rolsuper, me.rolcreaterole,
		       EXISTS (SELECT 1 FROM r), coalesce((SELECT rolsuper FROM r), false),
		       coalesce((SELECT bool_or(pg_has_role((SELECT oid FROM r), owner, 'MEMBER')) FROM t
		                 WHERE EXISTS (SELECT 1 FROM r)), false),
		       (SELECT owner FROM t WHERE relname = 'audit_event'),
		       coalesce((SELECT array_agg(DISTINCT owner ORDER BY owner) FROM t), '{}'),
		       coalesce((SELECT array_agg(relname ORDER BY relname) FROM t), '{}')
		FROM pg_roles me WHERE me.rolname = current_user`, role).
		Scan(&schema, &me, &meSuper, &meCreateRole, &exists, &super, &inOwners, &owner, &owners, &tables)
	if err != nil {
		return GrantPlan{}, fmt.Errorf("%w: read roles and tables: %v", ErrGrant, err)
	}
	if owner == nil {
		return GrantPlan{}, fmt.Errorf("%w: no audit_event table in schema %q: run `console migrate up` first", ErrGrant, schema)
	}
	p.Owner = *owner
	switch {
	case super:
		return GrantPlan{}, fmt.Errorf("%w: role %q is a superuser: a superuser bypasses every grant; use a role without SUPERUSER", ErrGrant, role)
	case inOwners:
		return GrantPlan{}, fmt.Errorf("%w: role %q owns tables or is a member of a table owner (%s): the application role must own nothing; run migrations as another role", ErrGrant, role, strings.Join(owners, ", "))
	case !exists && !meSuper && !meCreateRole:
		return GrantPlan{}, fmt.Errorf("%w: role %q does not exist and %q may not create roles: ask a superuser or a role with CREATEROLE to run CREATE ROLE %s LOGIN PASSWORD '…', then run this again", ErrGrant, role, me, pgx.Identifier{role}.Sanitize())
	}
	if err := q.QueryRow(ctx, `SELECT bool_and(pg_has_role(current_user, o, 'MEMBER')) FROM unnest($1::text[]) o`, owners).Scan(&ownerOK); err != nil {
		return GrantPlan{}, fmt.Errorf("%w: check table owners: %v", ErrGrant, err)
	}
	if !ownerOK && !meSuper {
		return GrantPlan{}, fmt.Errorf("%w: %q does not own the tables (owners: %s): run this as the role that runs migrations", ErrGrant, me, strings.Join(owners, ", "))
	}
	r := pgx.Identifier{role}.Sanitize()
	s := pgx.Identifier{schema}.Sanitize()
	o := pgx.Identifier{p.Owner}.Sanitize()
	special := map[string]bool{}
	for _, t := range append(append(append([]string{}, AppendOnlyTables...), readOnlyTables...), hiddenTables...) {
		special[t] = true
	}
	var dml []string
	for _, t := range tables {
		if !special[t] {
			dml = append(dml, pgx.Identifier{t}.Sanitize())
		}
	}
	if !exists {
		p.CreateRole = true
		p.Statements = append(p.Statements, "CREATE ROLE "+r+" LOGIN")
	}
	// Revoke first, so a privilege granted by hand (UPDATE on the trail)
	// does not survive; the transaction makes the swap atomic.
	p.Statements = append(p.Statements,
		"REVOKE ALL ON ALL TABLES IN SCHEMA "+s+" FROM "+r,
		"REVOKE ALL ON ALL SEQUENCES IN SCHEMA "+s+" FROM "+r,
		"GRANT USAGE ON SCHEMA "+s+" TO "+r,
	)
	if len(dml) > 0 {
		p.Statements = append(p.Statements, "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "+strings.Join(dml, ", ")+" TO "+r)
	}
	p.Statements = append(p.Statements,
		"GRANT SELECT, INSERT ON TABLE "+identifiers(AppendOnlyTables)+" TO "+r,
		"GRANT SELECT ON TABLE "+identifiers(readOnlyTables)+" TO "+r,
		// nextval on serial columns (identity columns need no grant).
		"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA "+s+" TO "+r,
		// Tables the owner creates later (by hand, or before `console
		// migrate` re-applies this plan) are usable at once; migrate then
		// narrows any new append-only table to INSERT and SELECT.
		"ALTER DEFAULT PRIVILEGES FOR ROLE "+o+" IN SCHEMA "+s+" GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO "+r,
		"ALTER DEFAULT PRIVILEGES FOR ROLE "+o+" IN SCHEMA "+s+" GRANT USAGE, SELECT ON SEQUENCES TO "+r,
		"INSERT INTO db_app_role (role_name) VALUES ("+literal(role)+") ON CONFLICT (role_name) DO NOTHING",
	)
	return p, nil
}

// Grant makes role the application role (see PlanGrant) in one
// transaction, creating the role when it does not exist and the current
// user may create roles. Running it again changes nothing.
func Grant(ctx context.Context, pool *pgxpool.Pool, role string) (GrantPlan, error) {
	return WithTxV(ctx, pool, func(tx pgx.Tx) (GrantPlan, error) {
		p, err := PlanGrant(ctx, tx, role)
		if err != nil {
			return GrantPlan{}, err
		}
		for _, s := range p.Statements {
			if _, err := tx.Exec(ctx, s); err != nil {
				return GrantPlan{}, fmt.Errorf("%w: %s: %v", ErrGrant, s, err)
			}
		}
		return p, nil
	})
}

// regrant re-applies Grant for every application role `console db grant`
// recorded, so the tables a migration adds are covered. A recorded role
// that was dropped since is forgotten. It returns the roles it granted.
func regrant(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	var recorded bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('db_app_role') IS NOT NULL`).Scan(&recorded); err != nil || !recorded {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `DELETE FROM db_app_role WHERE role_name NOT IN (SELECT rolname FROM pg_roles)`); err != nil {
		return nil, fmt.Errorf("forget dropped application roles: %w", err)
	}
	rows, _ := pool.Query(ctx, `SELECT role_name FROM db_app_role ORDER BY role_name`)
	roles, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read application roles: %w", err)
	}
	for _, r := range roles {
		if _, err := Grant(ctx, pool, r); err != nil {
			return nil, err
		}
	}
	return roles, nil
}

func identifiers(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = pgx.Identifier{n}.Sanitize()
	}
	return strings.Join(q, ", ")
}

// literal quotes s as an SQL string literal (standard_conforming_strings is
// on since PostgreSQL 9.1).
func literal(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
