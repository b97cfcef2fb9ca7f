package payments

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/csv"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/db"
)

// Results of one settlement line.
const (
	LineResolved    = "resolved"    // an unknown payment moved to the file's outcome
	LineAgreed      = "agreed"      // the payment was already in the file's outcome
	LineDiscrepancy = "discrepancy" // the payment is final with the other outcome: recorded for an operator, nothing changed
	LineProcessing  = "processing"  // still in flight; apply the file again later
	LineNotFound    = "not_found"   // the provider reports a charge we have no payment for
	// LineAwaiting: the line would resolve a payment above the four-eyes
	// threshold (SettlementOptions.FourEyes): a second operator approves or
	// rejects it; the payment stays unknown until then.
	LineAwaiting = "awaiting_approval"
)

// Errors of ParseSettlement (and so of ApplySettlement, before it changes
// anything).
var (
	ErrInvalidSettlement = errors.New("payments: invalid settlement file")
	ErrEmptySettlement   = errors.New("payments: settlement file has no settlement lines")
)

// SettlementProblem is one invalid line.
type SettlementProblem struct {
	Line    int
	Message string
}

// SettlementError lists every invalid line of a rejected file.
type SettlementError struct{ Problems []SettlementProblem }

// Error is one line: the count and the problems, each with its line number.
func (e *SettlementError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = fmt.Sprintf("line %d: %s", p.Line, p.Message)
	}
	return fmt.Sprintf("%d invalid line(s), nothing applied: %s", len(e.Problems), strings.Join(parts, "; "))
}

func (e *SettlementError) Unwrap() error { return ErrInvalidSettlement }

// SettlementEntry is one valid line of a settlement file.
type SettlementEntry struct {
	Line        int
	OperationID uuid.UUID
	Outcome     Outcome
	ProviderRef string
}

// SettlementFile is a settlement file read whole and validated.
type SettlementFile struct {
	Entries []SettlementEntry
	SHA256  string // of the file's bytes as given: the evidence's identity
}

// maxSettlementBytes bounds what ParseSettlement reads into memory.
const maxSettlementBytes = 256 << 20

// ParseSettlement reads and validates a whole provider settlement file (CSV,
// one record per line: operation_id,outcome[,provider_ref]; outcome
// succeeded|failed; an optional header line; '#' comments and blank lines
// ignored; a UTF-8 byte order mark accepted). Every line is checked on its
// own, so a broken quote cannot swallow the lines after it, and every
// problem is returned with its line number in a *SettlementError. A file
// without a single settlement line is ErrEmptySettlement.
func ParseSettlement(r io.Reader) (SettlementFile, error) {
	raw, err := io.ReadAll(io.LimitReader(r, maxSettlementBytes+1))
	if err != nil {
		return SettlementFile{}, fmt.Errorf("payments: read settlement file: %w", err)
	}
	if len(raw) > maxSettlementBytes {
		return SettlementFile{}, fmt.Errorf("%w: larger than %d bytes", ErrInvalidSettlement, maxSettlementBytes)
	}
	sum := sha256.Sum256(raw)
	f := SettlementFile{SHA256: hex.EncodeToString(sum[:])}
	var problems []SettlementProblem
	seen := map[uuid.UUID]SettlementEntry{}
	sc := bufio.NewScanner(bytes.NewReader(bytes.TrimPrefix(raw, []byte("\xef\xbb\xbf"))))
	sc.Buffer(make([]byte, 64<<10), maxSettlementBytes)
	line, first := 0, true
	for sc.Scan() {
		line++
		text := strings.TrimRight(sc.Text(), "\r")
		trimmed := strings.TrimSpace(text)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		e, err := parseSettlementLine(text)
		if first {
			first = false
			if fields, ferr := splitCSV(text); ferr == nil && strings.EqualFold(strings.TrimSpace(fields[0]), "operation_id") {
				continue // the header
			}
		}
		if err != nil {
			problems = append(problems, SettlementProblem{Line: line, Message: err.Error()})
			continue
		}
		e.Line = line
		if prev, ok := seen[e.OperationID]; ok && prev.Outcome != e.Outcome {
			problems = append(problems, SettlementProblem{Line: line, Message: fmt.Sprintf("operation %s is %s here but %s on line %d", e.OperationID, e.Outcome, prev.Outcome, prev.Line)})
			continue
		}
		seen[e.OperationID] = e
		f.Entries = append(f.Entries, e)
	}
	if err := sc.Err(); err != nil {
		return SettlementFile{}, fmt.Errorf("payments: read settlement file after line %d: %w", line, err)
	}
	if len(problems) > 0 {
		return SettlementFile{}, &SettlementError{Problems: problems}
	}
	if len(f.Entries) == 0 {
		return SettlementFile{}, ErrEmptySettlement
	}
	return f, nil
}

// splitCSV reads one line as one CSV record.
func splitCSV(text string) ([]string, error) {
	cr := csv.NewReader(strings.NewReader(text))
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	rec, err := cr.Read()
	if err != nil {
		var pe *csv.ParseError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("not CSV: %v", pe.Err)
		}
		return nil, fmt.Errorf("not CSV: %v", err)
	}
	if _, err := cr.Read(); !errors.Is(err, io.EOF) {
		return nil, errors.New("not CSV: a quoted field runs past the end of the line")
	}
	return rec, nil
}

func parseSettlementLine(text string) (SettlementEntry, error) {
	if !utf8.ValidString(text) {
		return SettlementEntry{}, errors.New("not UTF-8")
	}
	rec, err := splitCSV(text)
	if err != nil {
		return SettlementEntry{}, err
	}
	if len(rec) < 2 || len(rec) > 3 {
		return SettlementEntry{}, fmt.Errorf("want operation_id,outcome[,provider_ref], got %d field(s)", len(rec))
	}
	op, err := uuid.Parse(strings.TrimSpace(rec[0]))
	if err != nil {
		return SettlementEntry{}, errors.New("operation_id is not a UUID")
	}
	if op == uuid.Nil { // never an operation's id: a placeholder left in the file
		return SettlementEntry{}, errors.New("operation_id is the nil UUID")
	}
	outcome, err := ParseOutcome(strings.ToLower(strings.TrimSpace(rec[1])))
	if err != nil {
		return SettlementEntry{}, errors.New("outcome must be succeeded or failed")
	}
	e := SettlementEntry{OperationID: op, Outcome: outcome}
	if len(rec) == 3 {
		e.ProviderRef = strings.TrimSpace(rec[2])
		if len(e.ProviderRef) > 200 {
			return SettlementEntry{}, errors.New("provider_ref is longer than 200 characters")
		}
	}
	return e, nil
}

// DB is a pool (or a connection): it begins transactions and queries.
type DB interface {
	db.Beginner
	db.Querier
}

// SettlementLine is what happened (or, in a dry run, would happen) to one
// line of a settlement file.
type SettlementLine struct {
	Line        int
	OperationID string
	Outcome     Outcome
	Result      string
	Message     string
	FileSHA256  string // of the whole file: the evidence's identity
	ApprovalID  int64  // LineAwaiting: the four-eyes request (0: one was waiting already)
	ProviderRef string // the line's provider reference, if any
	// Of a LineDiscrepancy: our payment's status the line contradicts, and
	// what recording it did (DiscrepancyOpened, DiscrepancyOpen,
	// DiscrepancyClosed; a dry run says what it would do) to which
	// discrepancy (0 when none yet).
	Status        Status
	Discrepancy   string
	DiscrepancyID int64
}

// SettlementSummary counts the lines by result.
type SettlementSummary map[string]int

// SettlementOptions tune ApplySettlement.
type SettlementOptions struct {
	Source string               // recorded as resolved_by "settlement:<source>"
	Topic  string               // outbox topic (default sluice.payments)
	Now    func() time.Time     // nil: the database clock (tests inject one)
	Report func(SettlementLine) // called once per line, in order
	DryRun bool                 // read only: report what applying would do, change nothing
	Poker  Poker                // poked after each line that committed an outbox event (nil: none)
	// OnLine, when set, runs in each applied line's transaction after the
	// line's change (never in a dry run): what it writes (an audit row
	// naming the file and who applied it) commits with the line or not at
	// all, and its error rolls the line back and stops the file.
	OnLine func(ctx context.Context, tx pgx.Tx, l SettlementLine) error
	// FourEyes, when set, keeps the console's four-eyes rule for files: a
	// line that would resolve a payment of a larger amount records a
	// request for a second operator instead (RequestResolve), by whoever
	// applies the file. Without it (the command line, run by whoever holds
	// the database's credentials) every line applies.
	FourEyes *SettlementFourEyes
}

// SettlementFourEyes is the threshold and who asks.
type SettlementFourEyes struct {
	Above         decimal.Decimal // CONSOLE_FOUR_EYES_ABOVE
	RequestedBy   string          // iss|sub of the operator applying the file
	RequesterName string
}

// holds says whether a line about p waits for a second operator when it
// would resolve p. Decided on the amount alone (which never changes), as a
// typed resolution is: deciding on the status too let a payment that
// turned unknown between the read and the resolve be settled on one
// operator's word.
func (f *SettlementFourEyes) holds(p Payment) bool {
	return f != nil && p.Amount.GreaterThan(f.Above)
}

// ApplySettlement reads a provider settlement file whole (ParseSettlement)
// and, only if every line is valid, applies it line by line, one
// transaction per line. A line is a definite provider answer: it resolves
// an unknown payment once (so it may fail one and release its
// reservation); about a final payment it contradicts it records a
// discrepancy and changes nothing else. Applying the same file again
// changes nothing. With DryRun nothing is written.
func ApplySettlement(ctx context.Context, b DB, r io.Reader, o SettlementOptions) (SettlementSummary, error) {
	if o.Topic == "" {
		o.Topic = DefaultTopic
	}
	f, err := ParseSettlement(r)
	if err != nil {
		return nil, err
	}
	sum := SettlementSummary{}
	for _, e := range f.Entries {
		if err := ctx.Err(); err != nil {
			return sum, err
		}
		var l SettlementLine
		if o.DryRun {
			l, err = planLine(ctx, b, f, e, o)
		} else {
			l, err = applyLine(ctx, b, f, e, o)
		}
		if err != nil {
			// Lines before this one are applied; each is idempotent, so the
			// file can be applied again once the cause is fixed.
			return sum, fmt.Errorf("payments: settlement line %d (%s): %w", e.Line, e.OperationID, err)
		}
		if l.Result == LineResolved && !o.DryRun && o.Poker != nil {
			o.Poker.Poke() // the line's event is committed
		}
		sum[l.Result]++
		if o.Report != nil {
			o.Report(l)
		}
	}
	return sum, nil
}

func statusOf(o Outcome) Status {
	if o == OutcomeFailed {
		return StatusFailed
	}
	return StatusCompleted
}

// classify says what a line means for a payment that is not unknown.
func classify(l *SettlementLine, cur Payment, want Status) {
	l.Status = cur.Status
	switch {
	case cur.Status == want:
		l.Result, l.Message = LineAgreed, "already "+string(cur.Status)
	case cur.Status == StatusProcessing:
		l.Result, l.Message = LineProcessing, "still processing; apply the file again later"
	default:
		l.Result, l.Message = LineDiscrepancy, fmt.Sprintf("payment is %s but the provider says %s: discrepancy for an operator, payment unchanged", cur.Status, l.Outcome)
	}
}

// planLine is the dry run of applyLine: reads only.
func planLine(ctx context.Context, q db.RowQuerier, f SettlementFile, e SettlementEntry, o SettlementOptions) (SettlementLine, error) {
	l := SettlementLine{Line: e.Line, OperationID: e.OperationID.String(), Outcome: e.Outcome, FileSHA256: f.SHA256, ProviderRef: e.ProviderRef}
	cur, err := Get(ctx, q, e.OperationID)
	switch {
	case errors.Is(err, ErrNotFound):
		l.Result, l.Message = LineNotFound, "no payment with this operation_id: money moved at the provider without a payment of ours"
		return l, nil
	case err != nil:
		return l, fmt.Errorf("payments: read %s: %w", e.OperationID, err)
	}
	if cur.Status == StatusUnknown && o.FourEyes.holds(cur) {
		l.Result, l.Message = LineAwaiting, fmt.Sprintf("above the four-eyes threshold (%s): would ask a second operator to approve unknown → %s",
			o.FourEyes.Above.StringFixed(2), statusOf(e.Outcome))
		switch w, err := pendingOutcome(ctx, q, e.OperationID); {
		case err == nil && w == e.Outcome:
			l.Message = "a four-eyes request for this payment already waits for a second operator"
		case err == nil:
			l.Message = fmt.Sprintf("a four-eyes request for %s already waits, but this file says %s: reject that request, then apply the file again", w, e.Outcome)
		case !errors.Is(err, pgx.ErrNoRows):
			return l, fmt.Errorf("payments: pending request of %s: %w", e.OperationID, err)
		}
		return l, nil
	}
	if cur.Status == StatusUnknown {
		l.Result, l.Message = LineResolved, "would resolve unknown → "+string(statusOf(e.Outcome))
		if err := noteWaitingRequest(ctx, q, e.OperationID, &l); err != nil {
			return l, err
		}
		return l, nil
	}
	classify(&l, cur, statusOf(e.Outcome))
	if l.Result == LineDiscrepancy {
		closed, err := closedOnLine(ctx, q, e.OperationID, lineRef(f.SHA256, e.Line))
		if err != nil {
			return l, err
		}
		open, err := hasOpenDiscrepancy(ctx, q, e.OperationID)
		if err != nil {
			return l, err
		}
		l.Discrepancy = DiscrepancyOpened
		l.Message = fmt.Sprintf("payment is %s but the provider says %s: would record a discrepancy for an operator", cur.Status, e.Outcome)
		switch {
		case open:
			l.Discrepancy = DiscrepancyOpen
			l.Message = fmt.Sprintf("payment is %s but the provider says %s: a discrepancy is already open", cur.Status, e.Outcome)
		case closed != 0:
			l.Discrepancy, l.DiscrepancyID = DiscrepancyClosed, closed
			l.Message = fmt.Sprintf("payment is %s but the provider says %s: discrepancy #%d from this line was closed by an operator; not opened again", cur.Status, e.Outcome, closed)
		}
	}
	return l, nil
}

func applyLine(ctx context.Context, b DB, f SettlementFile, e SettlementEntry, o SettlementOptions) (SettlementLine, error) {
	l := SettlementLine{Line: e.Line, OperationID: e.OperationID.String(), Outcome: e.Outcome, FileSHA256: f.SHA256, ProviderRef: e.ProviderRef}
	var now *time.Time
	if o.Now != nil {
		t := o.Now().UTC().Truncate(time.Microsecond)
		now = &t
	}
	var resolveNow time.Time
	if now != nil {
		resolveNow = *now
	}
	err := db.WithTx(ctx, b, func(tx pgx.Tx) error {
		if err := applyEntry(ctx, tx, f, e, o, now, resolveNow, &l); err != nil {
			return err
		}
		if o.OnLine != nil {
			return o.OnLine(ctx, tx, l)
		}
		return nil
	})
	return l, err
}

// applyEntry applies one line in tx and says what it did in l.
func applyEntry(ctx context.Context, tx pgx.Tx, f SettlementFile, e SettlementEntry, o SettlementOptions, now *time.Time, resolveNow time.Time, l *SettlementLine) error {
	l.Result, l.Message = "", ""
	next := lineResolve
	if o.FourEyes != nil {
		// Above the threshold the line never resolves: it asks (or, the
		// payment not unknown, is classified below).
		var err error
		if next, err = requestLine(ctx, tx, f, e, o, l); next == lineHeld || err != nil {
			return err
		}
	}
	if next == lineResolve {
		p, rerr := Resolve(ctx, tx, e.OperationID, e.Outcome, ResolveOptions{ProviderRef: e.ProviderRef, ResolvedBy: "settlement:" + o.Source, Topic: o.Topic, Now: resolveNow})
		switch {
		case rerr == nil:
			l.Result, l.Message = LineResolved, "unknown → "+string(p.Status)
			return noteWaitingRequest(ctx, tx, e.OperationID, l)
		case errors.Is(rerr, ErrNotFound):
			l.Result, l.Message = LineNotFound, "no payment with this operation_id: money moved at the provider without a payment of ours"
			return nil
		case !errors.Is(rerr, ErrNotUnknown):
			return rerr
		}
	}
	// Locked until the line commits, so the status classified is the
	// status the discrepancy is filed against.
	cur, err := getForUpdate(ctx, tx, e.OperationID)
	if err != nil {
		return fmt.Errorf("payments: lock %s: %w", e.OperationID, err)
	}
	classify(l, cur, statusOf(e.Outcome))
	if l.Result != LineDiscrepancy {
		return nil
	}
	r, err := recordDiscrepancy(ctx, tx, Discrepancy{OperationID: e.OperationID, RecordedStatus: cur.Status, ProviderOutcome: e.Outcome,
		Source: DiscrepancySettlement, Evidence: lineEvidence(o.Source, f.SHA256, e.Line), ProviderRef: e.ProviderRef}, now, lineRef(f.SHA256, e.Line))
	if err != nil {
		return err
	}
	l.Discrepancy, l.DiscrepancyID = r.State, r.ID
	switch r.State {
	case DiscrepancyOpen:
		l.Message += " (already open)"
	case DiscrepancyClosed:
		// The operator's close stands: the same line seen again is not
		// new evidence.
		l.Message = fmt.Sprintf("payment is %s but the provider says %s: discrepancy #%d from this line was closed by an operator; not opened again", cur.Status, e.Outcome, r.ID)
	}
	return nil
}

// requestLine records a four-eyes request for a line about a payment above
// the threshold (held: the line is done). A payment at or below it, or not
// found, is left to applyEntry's resolve; one above it that is not unknown
// (RequestResolve checks under a share lock) to its classification: the
// line is then classified, never resolved.
func requestLine(ctx context.Context, tx pgx.Tx, f SettlementFile, e SettlementEntry, o SettlementOptions, l *SettlementLine) (lineNext, error) {
	cur, err := Get(ctx, tx, e.OperationID)
	if errors.Is(err, ErrNotFound) || (err == nil && !o.FourEyes.holds(cur)) {
		return lineResolve, nil
	}
	if err != nil {
		return lineResolve, fmt.Errorf("payments: read %s: %w", e.OperationID, err)
	}
	evidence := lineEvidence(o.Source, f.SHA256, e.Line)
	if e.ProviderRef != "" {
		evidence += ", provider reference " + e.ProviderRef
	}
	a, err := RequestResolve(ctx, tx, ApprovalRequest{OperationID: e.OperationID, Outcome: e.Outcome,
		Reason:   lineReason(e),
		Evidence: evidence, ProviderRef: e.ProviderRef,
		RequestedBy: o.FourEyes.RequestedBy, RequesterName: o.FourEyes.RequesterName})
	switch {
	case err == nil:
		l.Result, l.ApprovalID = LineAwaiting, a.ID
		l.Message = fmt.Sprintf("above the four-eyes threshold: request #%d waits for a second operator (unknown → %s)", a.ID, statusOf(e.Outcome))
		return lineHeld, nil
	case errors.Is(err, ErrApprovalPending):
		l.Result, l.Message = LineAwaiting, "a four-eyes request for this payment already waits for a second operator"
		if w, werr := pendingOutcome(ctx, tx, e.OperationID); werr == nil && w != e.Outcome {
			l.Message = fmt.Sprintf("a four-eyes request for %s already waits, but this file says %s: reject that request, then apply the file again", w, e.Outcome)
		}
		return lineHeld, nil
	case errors.Is(err, ErrNotUnknown):
		return lineClassify, nil // not unknown (any more): classified, never resolved here
	}
	return lineResolve, err
}

// lineNext is what applyEntry does with a line after requestLine.
type lineNext int

const (
	lineResolve  lineNext = iota // at or below the threshold, or no such payment: resolve as the file says
	lineHeld                     // a four-eyes request records it: done
	lineClassify                 // above the threshold and not unknown: classify, never resolve
)

// noteWaitingRequest says on a line that resolves its payment when a
// four-eyes request for it waits (the command line applies every line):
// the request is left for an operator to reject, and Approvals marks it.
func noteWaitingRequest(ctx context.Context, q db.RowQuerier, op uuid.UUID, l *SettlementLine) error {
	var id int64
	err := q.QueryRow(ctx, `SELECT id FROM payment_approval WHERE operation_id = $1 AND state = 'pending'`, op).Scan(&id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("payments: pending request of %s: %w", op, err)
	}
	l.Message += fmt.Sprintf(" (four-eyes request #%d waits for it: reject it on Approvals to close it)", id)
	return nil
}

// pendingOutcome is the outcome the payment's pending four-eyes request asks.
func pendingOutcome(ctx context.Context, q db.RowQuerier, op uuid.UUID) (Outcome, error) {
	var o string
	err := q.QueryRow(ctx, `SELECT outcome FROM payment_approval WHERE operation_id = $1 AND state = 'pending'`, op).Scan(&o)
	return Outcome(o), err
}

// lineEvidence names a file's line: its source, its hash (unless the
// source names it already, as the console's "console sha256:…" does) and
// the line. The hash counts as named only in lineRef's form: a file path
// that holds the bare hex (/srv/settle/<sha>.csv) still gets it, so every
// evidence ends with lineRef (a closed discrepancy is found by it).
func lineEvidence(source, sha string, line int) string {
	if strings.Contains(source, "sha256:"+sha) {
		return fmt.Sprintf("settlement %s line %d", source, line)
	}
	return fmt.Sprintf("settlement %s sha256:%s line %d", source, sha, line)
}

// lineReason is why a line asks a second operator: the request's reason and
// its audit row's.
func lineReason(e SettlementEntry) string {
	return fmt.Sprintf("the provider's settlement file says %s (line %d)", e.Outcome, e.Line)
}
