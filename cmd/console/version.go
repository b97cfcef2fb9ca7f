package main

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
)

// version and commit are set at build time with
// -ldflags "-X main.version=… -X main.commit=…"; otherwise read from the
// module build info.
var (
	version = "dev"
	commit  = ""
)

func runVersion(ctx context.Context, e env, args []string) error {
	var cfg config.Version
	if _, err := configure(e, "version", "Print the version, the commit and the schema version this binary ships\n(and, with DATABASE_URL, the schema version of the database).", &cfg, args, nil); err != nil {
		return err
	}
	c := commit
	if c == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" {
					c = s.Value
				}
			}
		}
	}
	if c == "" {
		c = "unknown"
	}
	fmt.Fprintf(e.stdout, "console %s\ncommit %s\nschema %d\n", version, c, db.LatestVersion())
	if cfg.DatabaseURL != "" {
		pool, err := db.Open(ctx, cfg.DatabaseURL)
		if err != nil {
			return err
		}
		defer pool.Close()
		v, err := db.SchemaVersion(ctx, pool)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "database schema %d\n", v)
	}
	return nil
}
