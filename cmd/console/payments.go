package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/payments"
)

func runPayments(ctx context.Context, e env, args []string) error {
	if len(args) == 0 || args[0] != "reconcile" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprintln(e.stdout, "Usage: console payments reconcile --file F   (apply a provider settlement file)")
			return config.ErrHelp
		}
		return &config.UsageError{Err: fmt.Errorf("want `payments reconcile --file F`")}
	}
	var c config.PaymentsReconcile
	f := config.NewFlags("payments reconcile", "Apply a provider settlement file (the end-of-day path): CSV lines operation_id,outcome[,provider_ref],\noutcome succeeded|failed. Each unknown payment named is resolved once (a line is a definite provider\nanswer); each line's result is printed, then a summary. Bad lines are reported and skipped.", e.lookup, e.stderr)
	c.Register(f)
	if err := f.Parse(args[1:]); err != nil {
		return err
	}
	if len(f.Args()) > 0 {
		return &config.UsageError{Err: fmt.Errorf("unexpected arguments: %v", f.Args())}
	}
	if err := c.Validate(); err != nil {
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
	sum, err := payments.ApplySettlement(ctx, pool, in, payments.SettlementOptions{
		Source: source, Topic: c.Topic,
		Report: func(l payments.SettlementLine) {
			fmt.Fprintf(e.stdout, "line %d\t%s\t%s\t%s\t%s\n", l.Line, l.Result, l.OperationID, l.Outcome, l.Message)
		},
	})
	if err != nil {
		return err
	}
	keys := make([]string, 0, len(sum))
	total := 0
	for k, n := range sum {
		keys = append(keys, k)
		total += n
	}
	sort.Strings(keys)
	fmt.Fprintf(e.stdout, "summary: %d line(s)", total)
	for _, k := range keys {
		fmt.Fprintf(e.stdout, ", %s %d", k, sum[k])
	}
	fmt.Fprintln(e.stdout)
	if sum[payments.LineInvalid] > 0 || sum[payments.LineMismatch] > 0 {
		return fmt.Errorf("%d invalid line(s), %d mismatch(es): see the lines above", sum[payments.LineInvalid], sum[payments.LineMismatch])
	}
	return nil
}
