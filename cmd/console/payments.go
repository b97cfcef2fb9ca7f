package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"sort"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/payments"
)

func runPayments(ctx context.Context, e env, args []string) error {
	verb, args, found := verbAmongFlags(args, &config.PaymentsReconcile{})
	if verb != "reconcile" {
		if (!found && askedForHelp(args)) || verb == "help" {
			fmt.Fprintln(e.stdout, "Usage: console payments reconcile --file F [--dry-run]   (apply a provider settlement file)")
			return config.ErrHelp
		}
		return &config.UsageError{Err: fmt.Errorf("want `payments reconcile --file F [--dry-run]`")}
	}
	var c config.PaymentsReconcile
	if _, err := configure(e, "payments reconcile", "Apply a provider settlement file (the end-of-day path): CSV lines operation_id,outcome[,provider_ref],\noutcome succeeded|failed. The whole file is read and validated first: one invalid line (or an empty file)\nand nothing is applied. Then each unknown payment named is resolved once (a line is a definite provider\nanswer); a final payment the file contradicts gets a discrepancy for an operator (closed in the console's\nDiscrepancies once the money is corrected) and is not changed. Settled lines, contradicting lines and lines\nnaming no payment of ours are each audited once, under --actor.\nEach line's result is printed, then a summary. Applying a file twice changes nothing the second time.\nWith --dry-run it prints what it would change and changes nothing.\nExit 1 when the file is invalid or empty, names charges we have no payment for, or contradicts us.", &c, args, nil); err != nil {
		return err
	}
	var in io.Reader = os.Stdin
	source := "stdin"
	if c.File != "-" {
		fh, err := os.Open(c.File)
		if err != nil {
			return fmt.Errorf("PAYMENTS_SETTLEMENT_FILE: %w", err)
		}
		defer fh.Close()
		in, source = fh, c.File
	}
	pool, err := db.OpenCurrent(ctx, c.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if c.DryRun {
		fmt.Fprintln(e.stdout, "dry run: nothing is changed")
	}
	actor := c.Actor
	if actor == "" {
		actor = osActor()
	}
	// Each settled payment, contradicting line and line naming no payment
	// of ours gets its audit row in its line's transaction, as from the
	// console: the file's hash and who applied it.
	base := audit.Event{ActorIss: "cli", ActorSub: actor, ActorName: actor, ActorRoles: []string{"cli"}}
	sum, err := payments.ApplySettlement(ctx, pool, in, payments.SettlementOptions{
		Source: source, Topic: c.Topic, DryRun: c.DryRun,
		OnLine: func(ctx context.Context, tx pgx.Tx, l payments.SettlementLine) error {
			return payments.AuditSettledLine(ctx, tx, base, l)
		},
		Report: func(l payments.SettlementLine) {
			fmt.Fprintf(e.stdout, "line %d\t%s\t%s\t%s\t%s\n", l.Line, l.Result, l.OperationID, l.Outcome, l.Message)
		},
	})
	var serr *payments.SettlementError
	switch {
	case errors.As(err, &serr):
		// Every problem on its own line for the operator, one line of
		// reason on stderr.
		for _, p := range serr.Problems {
			fmt.Fprintf(e.stdout, "line %d\tinvalid\t%s\n", p.Line, p.Message)
		}
		return fmt.Errorf("settlement file %s: %d invalid line(s) (first: line %d: %s); nothing applied", source, len(serr.Problems), serr.Problems[0].Line, serr.Problems[0].Message)
	case errors.Is(err, payments.ErrEmptySettlement):
		return fmt.Errorf("settlement file %s has no settlement lines; nothing applied", source)
	case err != nil:
		return fmt.Errorf("settlement file %s: %w", source, err)
	}
	keys := make([]string, 0, len(sum))
	total := 0
	for k, n := range sum {
		keys = append(keys, k)
		total += n
	}
	sort.Strings(keys)
	if c.DryRun {
		fmt.Fprint(e.stdout, "dry run ")
	}
	fmt.Fprintf(e.stdout, "summary: %d line(s)", total)
	for _, k := range keys {
		fmt.Fprintf(e.stdout, ", %s %d", k, sum[k])
	}
	fmt.Fprintln(e.stdout)
	if n, d := sum[payments.LineNotFound], sum[payments.LineDiscrepancy]; n > 0 || d > 0 {
		return fmt.Errorf("%d charge(s) at the provider with no payment of ours, %d discrepancy(ies) with our records: see the lines above", n, d)
	}
	return nil
}

// osActor names the command line's user: OS user@host.
func osActor() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return name + "@" + host
}
