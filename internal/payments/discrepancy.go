package payments

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/payments/provider"
)

// Sources of a discrepancy's evidence.
const (
	DiscrepancySettlement = "settlement" // a line of a provider settlement file
	DiscrepancyInquiry    = "inquiry"    // the provider's answer to an inquiry
)

// What recording a discrepancy did (SettlementLine.Discrepancy).
const (
	DiscrepancyOpened = "opened" // a new open discrepancy
	DiscrepancyOpen   = "open"   // one was open already: the evidence adds nothing
	// DiscrepancyClosed: an operator closed the discrepancy this very
	// evidence (the same file's same line) opened; it is not opened again.
	DiscrepancyClosed = "closed"
)

// Errors of closing a discrepancy.
var (
	// ErrDiscrepancyClosed: the discrepancy was closed already (by
	// another operator, or by the same one in another tab); the Discrepancy
	// returned with it says who, when and why.
	ErrDiscrepancyClosed = errors.New("payments: the discrepancy has been closed already")
	ErrNoResolution      = errors.New("payments: closing a discrepancy needs a reason")
)

// Discrepancy is a final payment that the provider's evidence contradicts:
// failed here while the provider says it charged (money moved without our
// books knowing), or completed here while the provider says it did not. A
// machine never corrects one: it is recorded, counted
// (sluice_payments_discrepancies) and left open for an operator, who
// corrects the money outside the system and closes it (CloseDiscrepancy:
// ResolvedAt, ResolvedBy, Resolution).
type Discrepancy struct {
	ID              int64
	OperationID     uuid.UUID
	RecordedStatus  Status  // our status when the evidence arrived
	ProviderOutcome Outcome // what the provider says
	Source          string  // DiscrepancySettlement or DiscrepancyInquiry
	Evidence        string  // e.g. "settlement eod.csv sha256:… line 7", "inquiry"
	ProviderRef     string
	DetectedAt      time.Time
	ResolvedAt      *time.Time
	ResolvedBy      string // iss|sub of the operator who closed it
	ResolverName    string
	Resolution      string // what the operator did about it, in their words
	// Of the payment, for the lists.
	Amount   decimal.Decimal
	Currency string
}

// Open reports whether no operator has closed d.
func (d Discrepancy) Open() bool { return d.ResolvedAt == nil }

// contradicts reports whether a definite provider outcome contradicts a
// payment's final status.
func contradicts(status Status, outcome Outcome) bool {
	return (status == StatusFailed && outcome == OutcomeSucceeded) || (status == StatusCompleted && outcome == OutcomeFailed)
}

// outcomeOfProvider maps a definite provider answer to an Outcome.
func outcomeOfProvider(o provider.Outcome) Outcome {
	if o == provider.Succeeded {
		return OutcomeSucceeded
	}
	return OutcomeFailed
}

// lineRef names a settlement file's line as every evidence of it ends
// ("… sha256:<hex> line <n>", lineEvidence), whatever the file's source.
func lineRef(sha string, line int) string { return fmt.Sprintf("sha256:%s line %d", sha, line) }

// recorded is what recordDiscrepancy did: State is DiscrepancyOpened,
// DiscrepancyOpen or DiscrepancyClosed ("" when the payment no longer has
// the status the evidence was about), ID the discrepancy it concerns (0
// when not known).
type recorded struct {
	ID    int64
	State string
}

// recordDiscrepancy records d unless the payment has an open discrepancy
// already, and only while the payment still has d.RecordedStatus (checked in
// the same statement, so evidence about a status that just changed is not
// filed against the new one). With line (a settlement line's lineRef), a
// discrepancy an operator closed that the same line opened is not opened
// again: applying yesterday's file once more must not undo the operator's
// close. It changes nothing else: not the payment, its reservation nor the
// ledger. It is detected at now (nil: the database clock); d.DetectedAt
// is ignored.
func recordDiscrepancy(ctx context.Context, q db.RowQuerier, d Discrepancy, now *time.Time, line string) (recorded, error) {
	var opened, closed, open *int64
	var matches bool
	err := q.QueryRow(ctx, `
		WITH closed AS (
			SELECT discrepancy_id FROM payment_discrepancy
			WHERE operation_id = @op AND resolved_at IS NOT NULL AND @line <> '' AND right(evidence, length(@line)) = @line
			ORDER BY discrepancy_id DESC LIMIT 1),
		ins AS (
			INSERT INTO payment_discrepancy (operation_id, recorded_status, provider_outcome, source, evidence, provider_ref, detected_at)
			SELECT p.operation_id, p.status, @outcome, @source, @evidence, nullif(@ref, ''), coalesce(@now::timestamptz, statement_timestamp())
			FROM payment p WHERE p.operation_id = @op AND p.status = @status AND NOT EXISTS (SELECT 1 FROM closed)
			ON CONFLICT (operation_id) WHERE resolved_at IS NULL DO NOTHING
			RETURNING discrepancy_id)
		SELECT (SELECT discrepancy_id FROM ins), (SELECT discrepancy_id FROM closed),
			(SELECT discrepancy_id FROM payment_discrepancy WHERE operation_id = @op AND resolved_at IS NULL),
			EXISTS (SELECT 1 FROM payment WHERE operation_id = @op AND status = @status)`, pgx.NamedArgs{
		"op": d.OperationID, "status": string(d.RecordedStatus), "outcome": string(d.ProviderOutcome), "source": d.Source,
		"evidence": d.Evidence, "ref": d.ProviderRef, "now": now, "line": line,
	}).Scan(&opened, &closed, &open, &matches)
	if err != nil {
		return recorded{}, fmt.Errorf("payments: record discrepancy of %s: %w", d.OperationID, err)
	}
	switch {
	case opened != nil:
		return recorded{ID: *opened, State: DiscrepancyOpened}, nil
	case !matches:
		return recorded{}, nil
	case open != nil: // what an operator must act on, whatever else
		return recorded{ID: *open, State: DiscrepancyOpen}, nil
	case closed != nil:
		return recorded{ID: *closed, State: DiscrepancyClosed}, nil
	}
	// Opened by a transaction that committed after this statement began:
	// the insert saw it, the statement's snapshot does not.
	return recorded{State: DiscrepancyOpen}, nil
}

// closedOnLine is the discrepancy an operator closed that the settlement
// line (lineRef) opened, if any (0: none): a dry run's recordDiscrepancy.
func closedOnLine(ctx context.Context, q db.RowQuerier, op uuid.UUID, line string) (int64, error) {
	var id int64
	err := q.QueryRow(ctx, `SELECT discrepancy_id FROM payment_discrepancy
		WHERE operation_id = $1 AND resolved_at IS NOT NULL AND right(evidence, length($2)) = $2
		ORDER BY discrepancy_id DESC LIMIT 1`, op, line).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("payments: closed discrepancy of %s: %w", op, err)
	}
	return id, nil
}

// hasOpenDiscrepancy reports whether the payment has an open discrepancy.
func hasOpenDiscrepancy(ctx context.Context, q db.RowQuerier, op uuid.UUID) (bool, error) {
	var open bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM payment_discrepancy WHERE operation_id = $1 AND resolved_at IS NULL)`, op).Scan(&open); err != nil {
		return false, fmt.Errorf("payments: open discrepancy of %s: %w", op, err)
	}
	return open, nil
}

// discrepancyFrom reads discrepancyCols: a discrepancy and its payment's
// amount.
const (
	discrepancyCols = `d.discrepancy_id, d.operation_id, d.recorded_status, d.provider_outcome, d.source, d.evidence,
	coalesce(d.provider_ref, ''), d.detected_at, d.resolved_at, coalesce(d.resolved_by, ''), coalesce(d.resolver_name, ''),
	coalesce(d.resolution, ''), p.amount::text, p.currency`
	discrepancyFrom = ` FROM payment_discrepancy d JOIN payment p ON p.operation_id = d.operation_id`
)

func scanDiscrepancy(row pgx.Row) (Discrepancy, error) {
	var d Discrepancy
	var status, outcome, amount string
	err := row.Scan(&d.ID, &d.OperationID, &status, &outcome, &d.Source, &d.Evidence, &d.ProviderRef, &d.DetectedAt,
		&d.ResolvedAt, &d.ResolvedBy, &d.ResolverName, &d.Resolution, &amount, &d.Currency)
	if err != nil {
		return Discrepancy{}, notFound(err)
	}
	d.RecordedStatus, d.ProviderOutcome = Status(status), Outcome(outcome)
	if d.Amount, err = decimal.NewFromString(amount); err != nil {
		return Discrepancy{}, fmt.Errorf("payments: discrepancy %d amount %q: %w", d.ID, amount, err)
	}
	return d, nil
}

func collectDiscrepancies(rows pgx.Rows, err error) ([]Discrepancy, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Discrepancy, error) { return scanDiscrepancy(r) })
}

// CountOpenDiscrepancies counts the discrepancies no operator has closed
// (O(open) on payment_discrepancy_open_idx).
func CountOpenDiscrepancies(ctx context.Context, q db.RowQuerier) (int, error) {
	var n int
	if err := q.QueryRow(ctx, `SELECT count(*) FROM payment_discrepancy WHERE resolved_at IS NULL`).Scan(&n); err != nil {
		return 0, fmt.Errorf("payments: count open discrepancies: %w", err)
	}
	return n, nil
}

// ListOpenDiscrepancies returns up to limit open discrepancies, oldest
// first (O(limit) on payment_discrepancy_open_idx).
func ListOpenDiscrepancies(ctx context.Context, q db.Querier, limit int) ([]Discrepancy, error) {
	if limit <= 0 || limit > 500 {
		limit = 50
	}
	page, err := ListDiscrepancies(ctx, q, DiscrepancyPage{Limit: limit})
	return page.Rows, err
}

// DiscrepancyPage asks for one page of the discrepancies list.
type DiscrepancyPage struct {
	Closed bool   // the closed ones, newest close first; otherwise the open ones, oldest first
	Limit  int    // default 50, at most 500
	After  string // the Next of the previous page; "" = the first page
}

// DiscrepancyList is one page of discrepancies, the cursor of the next (""
// on the last page), and the database clock it was read at.
type DiscrepancyList struct {
	Rows   []Discrepancy
	Next   string
	ReadAt time.Time
}

// ListDiscrepancies returns one keyset page of the open discrepancies,
// oldest detected first, along payment_discrepancy_open_idx, or of the
// closed ones, newest close first, along payment_discrepancy_closed_idx:
// a deep page costs what the first one does, never O(history). The cursor
// is opaque (version, list, the last row's time and id) and strictly
// checked: one of the other list, or altered, is ErrInvalidCursor.
func ListDiscrepancies(ctx context.Context, q db.Querier, p DiscrepancyPage) (DiscrepancyList, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 50
	}
	if limit > 500 {
		return DiscrepancyList{}, fmt.Errorf("%w: at most 500 rows per page", ErrInvalidFilter)
	}
	args := pgx.NamedArgs{"limit": limit + 1}
	if p.After != "" {
		at, id, err := decodeDiscrepancyCursor(p.Closed, p.After)
		if err != nil {
			return DiscrepancyList{}, err
		}
		args["c_at"], args["c_id"] = at, id
	}
	var out DiscrepancyList
	if err := q.QueryRow(ctx, `SELECT statement_timestamp()`).Scan(&out.ReadAt); err != nil {
		return DiscrepancyList{}, fmt.Errorf("payments: list discrepancies: %w", err)
	}
	rows, err := collectDiscrepancies(q.Query(ctx, discrepancyListSQL(p.Closed, p.After != ""), args))
	if err != nil {
		return DiscrepancyList{}, fmt.Errorf("payments: list discrepancies: %w", err)
	}
	out.Rows = rows
	if len(rows) > limit {
		out.Rows = rows[:limit]
		last := out.Rows[limit-1]
		at := last.DetectedAt
		if p.Closed {
			at = *last.ResolvedAt
		}
		out.Next = encodeDiscrepancyCursor(p.Closed, at, last.ID)
	}
	return out, nil
}

// discrepancyListSQL reads a page of one list after the cursor (@c_at,
// @c_id) when after, in its index's order: the open ones along
// payment_discrepancy_open_idx, the closed ones along
// payment_discrepancy_closed_idx (resolved_at DESC, id DESC).
func discrepancyListSQL(closed, after bool) string {
	where, order := "d.resolved_at IS NULL", "d.detected_at, d.discrepancy_id"
	if closed {
		where, order = "d.resolved_at IS NOT NULL", "d.resolved_at DESC, d.discrepancy_id DESC"
	}
	switch {
	case after && closed:
		where += " AND (d.resolved_at, d.discrepancy_id) < (@c_at, @c_id)"
	case after:
		where += " AND (d.detected_at, d.discrepancy_id) > (@c_at, @c_id)"
	}
	return `SELECT ` + discrepancyCols + discrepancyFrom + ` WHERE ` + where + ` ORDER BY ` + order + ` LIMIT @limit`
}

const discrepancyCursorVersion = 1

// 1 version + 1 list + 8 microseconds + 8 id.
const discrepancyCursorLen = 18

func encodeDiscrepancyCursor(closed bool, at time.Time, id int64) string {
	raw := make([]byte, 0, discrepancyCursorLen)
	var list byte
	if closed {
		list = 1
	}
	raw = append(raw, discrepancyCursorVersion, list)
	raw = binary.BigEndian.AppendUint64(raw, uint64(at.UnixMicro()))
	raw = binary.BigEndian.AppendUint64(raw, uint64(id))
	return base64.RawURLEncoding.EncodeToString(raw)
}

// discrepancyCursorText is the length of a cursor as written: the decoder
// skips line breaks, so a token of another length is not one we wrote.
var discrepancyCursorText = base64.RawURLEncoding.EncodedLen(discrepancyCursorLen)

// maxCursorTime bounds a cursor's time to what the database stores: a
// forged one beyond it would fail the query (a 500) instead of being
// refused (a 400).
var maxCursorTime = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

func decodeDiscrepancyCursor(closed bool, token string) (time.Time, int64, error) {
	raw, err := base64.RawURLEncoding.Strict().DecodeString(token)
	if err != nil || len(token) != discrepancyCursorText || len(raw) != discrepancyCursorLen || raw[0] != discrepancyCursorVersion || raw[1] > 1 {
		return time.Time{}, 0, ErrInvalidCursor
	}
	if (raw[1] == 1) != closed {
		return time.Time{}, 0, fmt.Errorf("%w: it belongs to the other list", ErrInvalidCursor)
	}
	us, id := int64(binary.BigEndian.Uint64(raw[2:10])), int64(binary.BigEndian.Uint64(raw[10:18]))
	at := time.UnixMicro(us).UTC()
	if id <= 0 || us < 0 || at.After(maxCursorTime) {
		return time.Time{}, 0, ErrInvalidCursor
	}
	return at, id, nil
}

// OpenDiscrepanciesOf returns a payment's open discrepancy (at most one,
// payment_discrepancy_open_op_idx), as a list for the console's page.
func OpenDiscrepanciesOf(ctx context.Context, q db.Querier, op uuid.UUID) ([]Discrepancy, error) {
	d, err := scanDiscrepancy(q.QueryRow(ctx, `SELECT `+discrepancyCols+discrepancyFrom+` WHERE d.operation_id = $1 AND d.resolved_at IS NULL`, op))
	switch {
	case errors.Is(err, ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("payments: open discrepancy of %s: %w", op, err)
	}
	return []Discrepancy{d}, nil
}

// DiscrepanciesOf returns a payment's discrepancies, open and closed, newest
// first (at most 50, payment_discrepancy_op_idx).
func DiscrepanciesOf(ctx context.Context, q db.Querier, op uuid.UUID) ([]Discrepancy, error) {
	out, err := collectDiscrepancies(q.Query(ctx, `SELECT `+discrepancyCols+discrepancyFrom+`
		WHERE d.operation_id = $1 ORDER BY d.discrepancy_id DESC LIMIT 50`, op))
	if err != nil {
		return nil, fmt.Errorf("payments: discrepancies of %s: %w", op, err)
	}
	return out, nil
}

// DiscrepancyClose is an operator's close of one open discrepancy.
type DiscrepancyClose struct {
	ID          int64
	OperationID uuid.UUID // the payment the operator saw it on; another one's is ErrNotFound
	ClosedBy    string    // iss|sub: no PII
	CloserName  string
	Reason      string // what was done outside the system (a refund, the provider's correction); required
}

// CloseDiscrepancy closes an open discrepancy in the caller's transaction
// (the console audits it in the same commit): compare-and-set on its being
// open, so of two operators closing it at once one succeeds and the other
// gets ErrDiscrepancyClosed with the discrepancy as it is (who closed it,
// when, why). It records who and why and changes nothing else: not the
// payment's status, its reservation nor the ledger. A final status is never
// flipped by the console (DESIGN.md invariant 10's spirit: money is
// corrected by people, outside, and a correction is a reversal, never an
// edit); closing says that was done. ErrNotFound: no such discrepancy of
// that payment; ErrNoResolution: no reason.
func CloseDiscrepancy(ctx context.Context, tx pgx.Tx, c DiscrepancyClose) (Discrepancy, error) {
	if strings.TrimSpace(c.Reason) == "" {
		return Discrepancy{}, ErrNoResolution
	}
	if c.ClosedBy == "" {
		return Discrepancy{}, fmt.Errorf("payments: close discrepancy %d: no operator", c.ID)
	}
	d, err := scanDiscrepancy(tx.QueryRow(ctx, `
		WITH d AS (
			UPDATE payment_discrepancy SET resolved_at = statement_timestamp(), resolved_by = @by, resolver_name = nullif(@name, ''),
				resolution = @reason
			WHERE discrepancy_id = @id AND operation_id = @op AND resolved_at IS NULL
			RETURNING *)
		SELECT `+discrepancyCols+` FROM d JOIN payment p ON p.operation_id = d.operation_id`,
		pgx.NamedArgs{"id": c.ID, "op": c.OperationID, "by": c.ClosedBy, "name": c.CloserName, "reason": c.Reason}))
	if err == nil {
		return d, nil
	}
	if !errors.Is(err, ErrNotFound) {
		return Discrepancy{}, fmt.Errorf("payments: close discrepancy %d: %w", c.ID, err)
	}
	// Not closed by this statement: closed already, or not this payment's.
	// The row lock the UPDATE waited for makes the read below see the
	// close that won.
	cur, err := scanDiscrepancy(tx.QueryRow(ctx, `SELECT `+discrepancyCols+discrepancyFrom+` WHERE d.discrepancy_id = $1 AND d.operation_id = $2`, c.ID, c.OperationID))
	switch {
	case errors.Is(err, ErrNotFound):
		return Discrepancy{}, ErrNotFound
	case err != nil:
		return Discrepancy{}, fmt.Errorf("payments: close discrepancy %d: %w", c.ID, err)
	case cur.Open():
		// Only a row that matched WHERE but was not updated lands here,
		// which the statement rules out; say so rather than loop.
		return cur, fmt.Errorf("payments: close discrepancy %d: it is open but was not closed", c.ID)
	}
	return cur, ErrDiscrepancyClosed
}

// GetDiscrepancy reads one discrepancy (ErrNotFound when there is none).
func GetDiscrepancy(ctx context.Context, q db.RowQuerier, id int64) (Discrepancy, error) {
	return scanDiscrepancy(q.QueryRow(ctx, `SELECT `+discrepancyCols+discrepancyFrom+` WHERE d.discrepancy_id = $1`, id))
}
