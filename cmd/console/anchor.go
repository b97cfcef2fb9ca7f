package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/config"
)

// The anchor signing key is read from the environment only, never a flag:
// a flag's value shows in the process list.

func signingKey(lookup config.Lookup) (ed25519.PrivateKey, error) {
	v, ok := lookup("AUDIT_SIGNING_KEY")
	if !ok || v == "" {
		return nil, errors.New("AUDIT_SIGNING_KEY is required: base64 of a 32-byte Ed25519 seed or 64-byte private key")
	}
	k, err := audit.ParseSigningKey(v)
	if err != nil {
		return nil, fmt.Errorf("AUDIT_SIGNING_KEY: %w", err)
	}
	return k, nil
}

// verifyKey is AUDIT_VERIFY_KEY, or the public half of AUDIT_SIGNING_KEY.
func verifyKey(e env) (ed25519.PublicKey, error) {
	if v, ok := e.lookup("AUDIT_VERIFY_KEY"); ok && v != "" {
		k, err := audit.ParseVerifyKey(v)
		if err != nil {
			return nil, fmt.Errorf("AUDIT_VERIFY_KEY: %w", err)
		}
		return k, nil
	}
	if v, ok := e.lookup("AUDIT_SIGNING_KEY"); ok && v != "" {
		k, err := signingKey(e.lookup)
		if err != nil {
			return nil, err
		}
		return k.Public().(ed25519.PublicKey), nil
	}
	return nil, errors.New("AUDIT_VERIFY_KEY (base64 Ed25519 public key) or AUDIT_SIGNING_KEY is required to check anchors")
}

func writeAnchor(ctx context.Context, e env, pool *pgxpool.Pool, out string) error {
	key, err := signingKey(e.lookup)
	if err != nil {
		return err
	}
	if out == "" {
		_, err = audit.WriteAnchor(ctx, pool, key, 0, e.stdout)
		return err
	}
	a, err := audit.AppendAnchor(ctx, pool, key, 0, out)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "anchor of seq %d (hash %s) appended to %s\n", a.Seq, a.Hash, out)
	return nil
}

func checkAnchorFile(ctx context.Context, e env, pool *pgxpool.Pool, path string) error {
	pub, err := verifyKey(e)
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("AUDIT_ANCHOR_FILE: %w", err)
	}
	defer f.Close()
	anchors, err := audit.ReadAnchors(f)
	if err != nil {
		return err
	}
	rep, err := audit.CheckAnchors(ctx, pool, anchors, pub)
	if err != nil {
		return err
	}
	for _, w := range rep.Warnings {
		fmt.Fprintf(e.stdout, "warning: %s\n", w)
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(e.stdout, "anchor problem: %s\n", p)
	}
	if !rep.OK() {
		return fmt.Errorf("%w: %s (%d of %d anchors failed)", errChainBroken, rep.Problems[0], len(rep.Problems), rep.Checked)
	}
	fmt.Fprintf(e.stdout, "anchors: all %d held by the chain, signed by key %s\n", rep.Checked, audit.KeyID(pub))
	return nil
}

// anchoring is the console's periodic anchor writer (serve): on when
// AUDIT_ANCHOR_FILE is set.
type anchoring struct {
	lookup config.Lookup // where AUDIT_SIGNING_KEY is read (never a flag)
	file   string
	every  time.Duration
	key    ed25519.PrivateKey
}

func (a *anchoring) Register(f *config.Flags) {
	f.String(&a.file, "audit-anchor-file", "AUDIT_ANCHOR_FILE", "", "append a signed anchor of the audit chain head to this file every AUDIT_ANCHOR_EVERY (needs AUDIT_SIGNING_KEY)")
	f.Duration(&a.every, "audit-anchor-every", "AUDIT_ANCHOR_EVERY", time.Hour, "interval of the periodic audit anchors")
}

// Validate checks the settings and reads the key before anything starts.
func (a *anchoring) Validate() error {
	if a.file == "" {
		return nil
	}
	if a.every < time.Second {
		return fmt.Errorf("AUDIT_ANCHOR_EVERY: %s is shorter than a second", a.every)
	}
	var err error
	a.key, err = signingKey(a.lookup)
	return err
}

// both is two subcommands' settings as one (serve's and its anchors').
type both [2]settings

func (b both) Register(f *config.Flags) {
	b[0].Register(f)
	b[1].Register(f)
}

func (b both) Validate() error {
	var ck config.Check
	ck.Add(b[0].Validate())
	ck.Add(b[1].Validate())
	return ck.Err()
}

// start runs the anchor writer until the returned stop is called (it
// waits for the writer to finish); a no-op without a file.
func (a *anchoring) start(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) (stop func()) {
	if a.file == "" {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		(&audit.Anchorer{DB: pool, Key: a.key, Every: a.every, File: a.file, Log: log}).Run(ctx)
	}()
	return func() { cancel(); <-done }
}
