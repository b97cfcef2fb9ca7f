package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/pii"
)

const piiUsage = `Usage: console pii <verb> [flags]

Personal data is sealed field by field (AES-256-GCM) with the key id beside
each value: payment customers (name, email, tax id) and the sensitive fields
of outbox payloads. PII_KEYS lists the keys, the first encrypts, all decrypt.

  keygen [--id ID]                 print a new key as id:base64key (put it first in PII_KEYS)
  rotate [--dry-run] [--batch N]   rewrite every value not under the first key (or in the old
                                   envelope format) under it, N rows per transaction; stopped
                                   halfway, run it again and it finishes
  check                            count values per key id and envelope version, and those
                                   that do not open: a key may go once no value needs it

A value whose key is lost cannot be recovered: back every key up outside the
database before it encrypts anything. rotate and check need DATABASE_URL
(or --database-url), PII_KEYS and PII_BLIND_INDEX_KEY.
`

func runPII(ctx context.Context, e env, args []string) error {
	verb, args, found := verbAmongFlags(args, &config.PII{}, &config.PIIKeygen{})
	switch {
	case !found && askedForHelp(args), verb == "help":
		fmt.Fprint(e.stdout, piiUsage)
		return config.ErrHelp
	case !found:
		fmt.Fprint(e.stderr, piiUsage)
		return &config.UsageError{Err: errors.New("want a verb: keygen, rotate or check")}
	}
	switch verb {
	case "keygen":
		return runPIIKeygen(e, args)
	case "rotate", "check":
	default:
		return &config.UsageError{Err: fmt.Errorf("unknown verb %q (want keygen, rotate or check)", verb)}
	}
	var c config.PII
	summary := "Re-encrypt every PII value that is not under the first key of PII_KEYS, in small resumable batches."
	if verb == "check" {
		summary = "Count PII values per key id and envelope version, and those that do not open."
	}
	if _, err := configure(e, "pii "+verb, summary, &c, args, nil); err != nil {
		return err
	}
	if verb == "check" && c.DryRun {
		return &config.UsageError{Err: errors.New("--dry-run belongs to rotate; check changes nothing anyway")}
	}
	pool, err := db.OpenCurrent(ctx, c.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if verb == "check" {
		return piiCheck(ctx, e, pool, c)
	}
	return piiRotate(ctx, e, pool, c)
}

func runPIIKeygen(e env, args []string) error {
	var c config.PIIKeygen
	if _, err := configure(e, "pii keygen", "Print a new PII data key as id:base64key. Put it first in PII_KEYS (keep the old keys after it),\nback it up outside the database, then run `console pii rotate`.", &c, args, nil); err != nil {
		return err
	}
	if c.KeyID == "" {
		c.KeyID = "k" + time.Now().UTC().Format("20060102")
	}
	key, err := pii.GenerateKey(c.KeyID)
	if err != nil {
		return &config.UsageError{Err: err} // the only input is --id
	}
	fmt.Fprintln(e.stdout, key)
	fmt.Fprintf(e.stderr, "new key %s: back it up outside the database, put it first in PII_KEYS, then run `console pii rotate`\n", c.KeyID)
	return nil
}

func piiRotate(ctx context.Context, e env, pool *pgxpool.Pool, c config.PII) error {
	q := pool
	kr := c.Keyring
	anyEnv, current := kr.PayloadMarkers()
	match := outbox.PayloadMatch{Any: anyEnv, Current: current}
	customers, err := payments.CountStaleCustomers(ctx, q, kr)
	if err != nil {
		return err
	}
	events, err := outbox.CountPayloads(ctx, q, match)
	if err != nil {
		return err
	}
	verb := "rotating"
	if c.DryRun {
		verb = "dry run: nothing is changed; counting"
	}
	fmt.Fprintf(e.stdout, "%s to key %s: %d payment(s) and %d outbox event(s) hold values to rewrite\n", verb, kr.PrimaryKeyID(), customers, events)

	bar := newProgress(e.stdout, "payments", customers)
	rep, err := payments.RotateCustomers(ctx, pool, kr, payments.RotateOptions{Batch: c.Batch, DryRun: c.DryRun, Progress: bar.update})
	bar.done()
	if err != nil {
		return fmt.Errorf("%w (committed batches stay; run it again to finish)", err)
	}
	var evRewritten, evFailed int64
	bar = newProgress(e.stdout, "outbox events", events)
	visited, _, err := outbox.RewritePayloads(ctx, pool, match, outbox.RewriteOptions{Batch: c.Batch, DryRun: c.DryRun, Progress: bar.update},
		func(r outbox.PayloadRow) ([]byte, error) {
			out, n, failed, err := kr.ResealPayload(r.EventType, r.ID.String(), r.Payload)
			evRewritten += int64(n)
			evFailed += int64(failed)
			return out, err
		})
	bar.done()
	if err != nil {
		return fmt.Errorf("%w (committed batches stay; run it again to finish)", err)
	}
	would := ""
	if c.DryRun {
		would = "would be "
	}
	fmt.Fprintf(e.stdout, "summary: payments: %d visited, %d value(s) %srewritten, %d tax id index(es) %sfilled; outbox: %d event(s) visited, %d value(s) %srewritten\n",
		rep.Rows, rep.Rewritten, would, rep.Indexed, would, visited, evRewritten, would)
	if failed := rep.Failed + evFailed; failed > 0 {
		return fmt.Errorf("%d value(s) do not open with PII_KEYS and were left as they are: restore their key (see `console pii check`) or accept their loss", failed)
	}
	if !c.DryRun {
		fmt.Fprintf(e.stdout, "every value opens and is under key %s; `console pii check` shows which old keys may go\n", kr.PrimaryKeyID())
	}
	return nil
}

func piiCheck(ctx context.Context, e env, pool *pgxpool.Pool, c config.PII) error {
	kr := c.Keyring
	customers, err := payments.CensusCustomers(ctx, pool, kr, c.Batch)
	if err != nil {
		return err
	}
	anyEnv, _ := kr.PayloadMarkers()
	var events pii.Census
	if _, err := outbox.ScanPayloads(ctx, pool, outbox.PayloadMatch{Any: anyEnv}, c.Batch, func(r outbox.PayloadRow) error {
		kr.CensusPayload(&events, r.EventType, r.ID.String(), r.Payload)
		return nil
	}); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "primary key: %s (PII_KEYS: %s)\n", kr.PrimaryKeyID(), strings.Join(kr.KeyIDs(), ", "))
	for _, part := range []struct {
		name string
		c    pii.Census
	}{{"payment customers", customers}, {"outbox payloads", events}} {
		fmt.Fprintf(e.stdout, "%s:\n", part.name)
		lines := part.c.Lines()
		if len(lines) == 0 {
			lines = []string{"no sealed values"}
		}
		for _, l := range lines {
			fmt.Fprintf(e.stdout, "  %s\n", l)
		}
	}
	var all pii.Census
	all.Merge(customers)
	all.Merge(events)
	for _, id := range kr.KeyIDs()[1:] {
		n := 0
		for kv, v := range all.Values {
			if kv.KeyID == id {
				n += v
			}
		}
		if n > 0 {
			fmt.Fprintf(e.stdout, "key %s: %d value(s) still need it; run `console pii rotate`\n", id, n)
		} else {
			fmt.Fprintf(e.stdout, "key %s: no value needs it; it may leave PII_KEYS (keep its backup while database backups made before the rotation exist)\n", id)
		}
	}
	fmt.Fprintf(e.stdout, "summary: %d value(s) not current (another key or envelope v1), %d undecryptable\n", all.Stale, all.Undecryptable())
	if n := all.Undecryptable(); n > 0 {
		return fmt.Errorf("%d value(s) do not open with PII_KEYS: a key is missing from PII_KEYS, or the values were altered", n)
	}
	return nil
}

// progress shows a rotation's advance: a redrawn bar on a terminal, plain
// lines at each tenth otherwise (logs and pipes get no control characters).
type progress struct {
	w        io.Writer
	what     string
	total    int64
	tty      bool
	lastStep int64
	drawn    bool
}

func newProgress(w io.Writer, what string, total int64) *progress {
	return &progress{w: w, what: what, total: total, tty: isTerminal(w), lastStep: -1}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func (p *progress) update(done int64) {
	if p.total <= 0 {
		return
	}
	pct := min(done*100/p.total, 100)
	if p.tty {
		const width = 30
		fill := int(pct * width / 100)
		fmt.Fprintf(p.w, "\r%-14s [%s%s] %3d%% %d/%d", p.what, strings.Repeat("#", fill), strings.Repeat(".", width-fill), pct, done, p.total)
		p.drawn = true
		return
	}
	if step := pct / 10; step > p.lastStep {
		p.lastStep = step
		fmt.Fprintf(p.w, "%s: %d/%d (%d%%)\n", p.what, done, p.total, pct)
	}
}

func (p *progress) done() {
	if p.drawn {
		fmt.Fprintln(p.w)
	}
}
