package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
)

// errChainBroken is returned (exit 1) when audit verify finds a broken row.
var errChainBroken = errors.New("audit chain broken")

func runAudit(ctx context.Context, e env, args []string) error {
	var c config.Database
	verb := func(rest []string) error {
		if len(rest) != 1 || rest[0] != "verify" {
			return fmt.Errorf("want `audit verify`, got %q", rest)
		}
		return nil
	}
	if _, err := configure(e, "audit", "`audit verify`: walk the audit hash chain; exit 0 when intact, exit 1 naming the first broken sequence number.\nPrints the head hash of an intact chain: keep it outside the database to detect a truncated tail.", &c, args, verb); err != nil {
		return err
	}
	pool, err := db.Open(ctx, c.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := audit.Verify(ctx, pool)
	if err != nil {
		return err
	}
	if !res.Intact() {
		return fmt.Errorf("%w at seq %d: %s (%d rows checked)", errChainBroken, res.FirstBroken, res.Problem, res.Checked)
	}
	fmt.Fprintf(e.stdout, "audit chain intact: %d rows, head seq %d, head hash %s\n", res.Checked, res.HeadSeq, hex.EncodeToString(res.HeadHash))
	return nil
}
