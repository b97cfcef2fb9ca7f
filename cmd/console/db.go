package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
)

func runDB(ctx context.Context, e env, args []string) error {
	var (
		c      config.Common
		role   string
		dryRun bool
	)
	f := config.NewFlags("db", "`db grant --role NAME`: make NAME the application role the services connect as. Run it as the role that\n"+
		"runs migrations (the tables' owner). NAME owns nothing; it may INSERT and SELECT on audit_event and ledger_entry and\n"+
		"nothing more there, SELECT/INSERT/UPDATE/DELETE on the other tables, and use the sequences. NAME is created (LOGIN, no\n"+
		"password: set one with ALTER ROLE) when it does not exist and this role may create roles. Running it again changes\n"+
		"nothing; `console migrate up` re-applies it for every role granted this way, so new tables are covered.", e.lookup, e.stderr)
	f.String(&c.DatabaseURL, "database-url", "DATABASE_URL", "", "PostgreSQL ≥ 15 connection URL, as the tables' owner")
	f.String(&role, "role", "DB_APP_ROLE", "", "the application role")
	f.Bool(&dryRun, "dry-run", "", false, "print the SQL and change nothing")
	if err := f.Parse(args); err != nil {
		return err
	}
	if rest := f.Args(); len(rest) != 1 || rest[0] != "grant" {
		return &config.UsageError{Err: fmt.Errorf("want `db grant --role NAME`, got %q", rest)}
	}
	var ck config.Check
	ck.DatabaseURL("DATABASE_URL", c.DatabaseURL)
	ck.Required("DB_APP_ROLE", role)
	if err := ck.Err(); err != nil {
		return err
	}
	pool, err := db.OpenCurrent(ctx, c.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if dryRun {
		p, err := db.PlanGrant(ctx, pool, role)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "-- dry run: nothing was changed. `console db grant --role %s` would run:\n%s", role, p.SQL())
		return nil
	}
	p, err := db.Grant(ctx, pool, role)
	if err != nil {
		return err
	}
	if p.CreateRole {
		fmt.Fprintf(e.stdout, "created role %s (LOGIN, no password: set one with ALTER ROLE %s PASSWORD '…')\n", role, role)
	}
	fmt.Fprintf(e.stdout, "role %s: INSERT and SELECT on %s; DML on the other tables; owner %s keeps ownership (%d statements)\n",
		role, strings.Join(db.AppendOnlyTables, ", "), p.Owner, len(p.Statements))
	return nil
}
