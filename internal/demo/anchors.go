package demo

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"os"
	"path/filepath"
	"time"

	"github.com/sluice-dev/sluice/internal/audit"
)

// anchorEvery is the demo's audit anchor interval.
const anchorEvery = time.Minute

// startAnchors generates the demo's audit signing key and appends a signed
// anchor of the chain head to a file every anchorEvery, as `console serve`
// does with AUDIT_SIGNING_KEY and AUDIT_ANCHOR_FILE.
func (d *Demo) startAnchors(ctx context.Context) error {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "sluice-anchors-")
	if err != nil {
		return err
	}
	d.anchorFile = filepath.Join(dir, "audit-anchors.jsonl")
	d.anchorVerifyKey = base64.StdEncoding.EncodeToString(pub)
	a := &audit.Anchorer{DB: d.pool, Key: key, Every: anchorEvery, File: d.anchorFile, Log: d.log}
	d.goRun("audit anchors", func() error { a.Run(ctx); return nil })
	return nil
}
