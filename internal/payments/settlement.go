package payments

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
)

// Results of one settlement line.
const (
	LineResolved   = "resolved"   // an unknown payment moved to the file's outcome
	LineAgreed     = "agreed"     // the payment was already in the file's outcome
	LineMismatch   = "mismatch"   // the payment is final with the other outcome: an operator must look
	LineProcessing = "processing" // still in flight; apply the file again later
	LineNotFound   = "not_found"  // no such payment
	LineInvalid    = "invalid"    // the line could not be read
)

// DB is a pool (or a connection): it begins transactions and queries.
type DB interface {
	db.Beginner
	querier
}

// SettlementLine is what happened to one line of a settlement file.
type SettlementLine struct {
	Line        int
	OperationID string
	Outcome     Outcome
	Result      string
	Message     string
}

// SettlementSummary counts the lines by result.
type SettlementSummary map[string]int

// SettlementOptions tune ApplySettlement.
type SettlementOptions struct {
	Source string               // recorded as resolved_by "settlement:<source>"
	Topic  string               // outbox topic (default sluice.payments)
	Now    func() time.Time     // default time.Now
	Report func(SettlementLine) // called once per line, in order
}

// ApplySettlement reads a provider settlement file (CSV:
// operation_id,outcome[,provider_ref]; outcome succeeded|failed; an
// optional header line; '#' comments) and resolves each unknown payment it
// names, one transaction per line. A settlement line is a definite provider
// answer, so it may fail an unknown payment and release its reservation.
// Bad lines are reported and skipped; the rest still apply.
func ApplySettlement(ctx context.Context, b DB, r io.Reader, o SettlementOptions) (SettlementSummary, error) {
	if o.Topic == "" {
		o.Topic = DefaultTopic
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.Comment = '#'
	cr.TrimLeadingSpace = true
	cr.ReuseRecord = true
	sum := SettlementSummary{}
	report := func(l SettlementLine) {
		sum[l.Result]++
		if o.Report != nil {
			o.Report(l)
		}
	}
	first := true
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return sum, nil
		}
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				report(SettlementLine{Line: pe.StartLine, Result: LineInvalid, Message: "not CSV: " + pe.Err.Error()})
				continue
			}
			return sum, err
		}
		line, _ := cr.FieldPos(0)
		if first {
			first = false
			if strings.EqualFold(strings.TrimSpace(rec[0]), "operation_id") {
				continue
			}
		}
		if ctx.Err() != nil {
			return sum, ctx.Err()
		}
		report(applyLine(ctx, b, line, rec, o))
	}
}

func applyLine(ctx context.Context, b DB, line int, rec []string, o SettlementOptions) SettlementLine {
	l := SettlementLine{Line: line}
	if len(rec) < 2 || len(rec) > 3 {
		l.Result, l.Message = LineInvalid, fmt.Sprintf("want operation_id,outcome[,provider_ref], got %d fields", len(rec))
		return l
	}
	raw := strings.TrimSpace(rec[0])
	op, err := uuid.Parse(raw)
	if err != nil {
		l.Result, l.Message = LineInvalid, "operation_id is not a UUID"
		return l
	}
	l.OperationID = op.String()
	outcome, err := ParseOutcome(strings.ToLower(strings.TrimSpace(rec[1])))
	if err != nil {
		l.Result, l.Message = LineInvalid, "outcome must be succeeded or failed"
		return l
	}
	l.Outcome = outcome
	ref := ""
	if len(rec) == 3 {
		ref = strings.TrimSpace(rec[2])
		if len(ref) > 200 {
			l.Result, l.Message = LineInvalid, "provider_ref is longer than 200 characters"
			return l
		}
	}
	var p Payment
	err = db.WithTx(ctx, b, func(tx pgx.Tx) error {
		var err error
		p, err = Resolve(ctx, tx, op, outcome, ResolveOptions{ProviderRef: ref, ResolvedBy: "settlement:" + o.Source, Topic: o.Topic, Now: o.Now()})
		return err
	})
	switch {
	case err == nil:
		l.Result, l.Message = LineResolved, "unknown → "+string(p.Status)
	case errors.Is(err, ErrNotFound):
		l.Result, l.Message = LineNotFound, "no payment with this operation_id"
	case errors.Is(err, ErrNotUnknown):
		cur, gerr := Get(ctx, b, op)
		if gerr != nil {
			l.Result, l.Message = LineInvalid, "could not read the payment"
			return l
		}
		want := StatusCompleted
		if outcome == OutcomeFailed {
			want = StatusFailed
		}
		switch cur.Status {
		case want:
			l.Result, l.Message = LineAgreed, "already "+string(cur.Status)
		case StatusProcessing:
			l.Result, l.Message = LineProcessing, "still processing; apply the file again later"
		default:
			l.Result, l.Message = LineMismatch, fmt.Sprintf("payment is %s but the provider says %s: needs an operator", cur.Status, outcome)
		}
	default:
		l.Result, l.Message = LineInvalid, "could not apply: "+err.Error()
	}
	return l
}
