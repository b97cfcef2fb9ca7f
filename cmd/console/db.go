package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
)

const dbUsage = "`db grant --role NAME`: make NAME the application role the services connect as. Run it as the role that\n" +
	"runs migrations (the tables' owner). NAME owns nothing; it may INSERT and SELECT on audit_event and ledger_entry and\n" +
	"nothing more there, SELECT/INSERT/UPDATE/DELETE on the other tables, and use the sequences. NAME is created (LOGIN, no\n" +
	"password: set one with ALTER ROLE) when it does not exist and this role may create roles. Running it again changes\n" +
	"nothing; `console migrate up` re-applies it for every role granted this way, so new tables are covered."

// grantSettings are `console db grant`'s flags. --dry-run is per
// invocation, so it has no environment twin.
type grantSettings struct {
	config.Database
	role   string
	dryRun bool
}

func (s *grantSettings) Register(f *config.Flags) {
	s.Database.Register(f)
	f.String(&s.role, "role", "DB_APP_ROLE", "", "the application role")
	f.Bool(&s.dryRun, "dry-run", "", false, "print the SQL and change nothing")
}

func (s *grantSettings) Validate() error {
	var ck config.Check
	ck.Add(s.Database.Validate())
	ck.Required("DB_APP_ROLE", s.role)
	return ck.Err()
}

func runDB(ctx context.Context, e env, args []string) error {
	var c grantSettings
	verb := func(rest []string) error {
		if len(rest) != 1 || rest[0] != "grant" {
			return fmt.Errorf("want `db grant --role NAME`, got %q", rest)
		}
		return nil
	}
	if _, err := configure(e, "db", dbUsage, &c, args, verb); err != nil {
		return err
	}
	pool, err := db.OpenCurrent(ctx, c.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if c.dryRun {
		p, err := db.PlanGrant(ctx, pool, c.role)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "-- dry run: nothing was changed. `console db grant --role %s` would run:\n%s", c.role, p.SQL())
		return nil
	}
	p, err := db.Grant(ctx, pool, c.role)
	if err != nil {
		return err
	}
	if p.CreateRole {
		fmt.Fprintf(e.stdout, "created role %s (LOGIN, no password: set one with ALTER ROLE %s PASSWORD '…')\n", c.role, c.role)
	}
	fmt.Fprintf(e.stdout, "role %s: INSERT and SELECT on %s; DML on the other tables; owner %s keeps ownership (%d statements)\n",
		c.role, strings.Join(db.AppendOnlyTables, ", "), p.Owner, len(p.Statements))
	return nil
}
