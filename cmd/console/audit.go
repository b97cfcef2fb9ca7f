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

const auditUsage = "`audit verify [--anchors FILE]`: walk the audit hash chain; exit 0 when intact, exit 1 naming the first\n" +
	"broken sequence number. With --anchors, also prove the chain still holds every signed anchor in FILE (exit 1 naming\n" +
	"the anchor whose head is missing or different, or whose signature is bad); gaps in periodic anchors are warnings.\n" +
	"`audit anchor [--out FILE]`: print (or append to FILE) a signed checkpoint of the chain head, one JSON line.\n" +
	"Keys: AUDIT_SIGNING_KEY signs (base64 of a 32-byte Ed25519 seed or 64-byte private key); verify uses AUDIT_VERIFY_KEY\n" +
	"(base64 of the 32-byte public key) or the public half of AUDIT_SIGNING_KEY."

// auditSettings are `console audit`'s flags.
type auditSettings struct {
	config.Database
	anchorsIn, outTo string
}

func (s *auditSettings) Register(f *config.Flags) {
	s.Database.Register(f)
	f.String(&s.anchorsIn, "anchors", "AUDIT_ANCHOR_FILE", "", "verify: the anchors file (JSON lines) the chain must still hold")
	f.String(&s.outTo, "out", "AUDIT_ANCHOR_FILE", "", "anchor: append the anchor to this file instead of printing it")
}

func runAudit(ctx context.Context, e env, args []string) error {
	var c auditSettings
	verb := func(rest []string) error {
		if len(rest) != 1 || (rest[0] != "verify" && rest[0] != "anchor") {
			return fmt.Errorf("want `audit verify` or `audit anchor`, got %q", rest)
		}
		return nil
	}
	rest, err := configure(e, "audit", auditUsage, &c, args, verb)
	if err != nil {
		return err
	}
	pool, err := db.Open(ctx, c.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if rest[0] == "anchor" {
		return writeAnchor(ctx, e, pool, c.outTo)
	}
	res, err := audit.Verify(ctx, pool)
	if err != nil {
		return err
	}
	if !res.Intact() {
		return fmt.Errorf("%w at seq %d: %s (%d rows checked)", errChainBroken, res.FirstBroken, res.Problem, res.Checked)
	}
	fmt.Fprintf(e.stdout, "audit chain intact: %d rows, head seq %d, head hash %s\n", res.Checked, res.HeadSeq, hex.EncodeToString(res.HeadHash))
	if c.anchorsIn == "" {
		return nil
	}
	return checkAnchorFile(ctx, e, pool, c.anchorsIn)
}
