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

// errChainBroken is returned (exit 1) when audit verify finds a broken row
// or an anchor the chain no longer holds.
var errChainBroken = errors.New("audit chain broken")

func runAudit(ctx context.Context, e env, args []string) error {
	var (
		c                config.Common
		anchorsIn, outTo string
	)
	f := config.NewFlags("audit", "`audit verify [--anchors FILE]`: walk the audit hash chain; exit 0 when intact, exit 1 naming the first\n"+
		"broken sequence number. With --anchors, also prove the chain still holds every signed anchor in FILE (exit 1 naming\n"+
		"the anchor whose head is missing or different, or whose signature is bad); gaps in periodic anchors are warnings.\n"+
		"`audit anchor [--out FILE]`: print (or append to FILE) a signed checkpoint of the chain head, one JSON line.\n"+
		"Keys: AUDIT_SIGNING_KEY signs (base64 of a 32-byte Ed25519 seed or 64-byte private key); verify uses AUDIT_VERIFY_KEY\n"+
		"(base64 of the 32-byte public key) or the public half of AUDIT_SIGNING_KEY.", e.lookup, e.stderr)
	f.String(&c.DatabaseURL, "database-url", "DATABASE_URL", "", "PostgreSQL ≥ 15 connection URL")
	f.String(&anchorsIn, "anchors", "AUDIT_ANCHOR_FILE", "", "verify: the anchors file (JSON lines) the chain must still hold")
	f.String(&outTo, "out", "AUDIT_ANCHOR_FILE", "", "anchor: append the anchor to this file instead of printing it")
	if err := f.Parse(args); err != nil {
		return err
	}
	rest := f.Args()
	if len(rest) != 1 || (rest[0] != "verify" && rest[0] != "anchor") {
		return &config.UsageError{Err: fmt.Errorf("want `audit verify` or `audit anchor`, got %q", rest)}
	}
	var ck config.Check
	ck.DatabaseURL("DATABASE_URL", c.DatabaseURL)
	if err := ck.Err(); err != nil {
		return err
	}
	pool, err := db.Open(ctx, c.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if rest[0] == "anchor" {
		return writeAnchor(ctx, e, pool, outTo)
	}
	res, err := audit.Verify(ctx, pool)
	if err != nil {
		return err
	}
	if !res.Intact() {
		return fmt.Errorf("%w at seq %d: %s (%d rows checked)", errChainBroken, res.FirstBroken, res.Problem, res.Checked)
	}
	fmt.Fprintf(e.stdout, "audit chain intact: %d rows, head seq %d, head hash %s\n", res.Checked, res.HeadSeq, hex.EncodeToString(res.HeadHash))
	if anchorsIn == "" {
		return nil
	}
	return checkAnchorFile(ctx, e, pool, anchorsIn)
}
