package payments

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/db"
)

// ErrInvalidFilter reports a console list filter that cannot run; its text
// names the field, fit for a form.
var ErrInvalidFilter = errors.New("payments: invalid filter")

// ErrInvalidCursor reports a page cursor that is malformed, forged, or
// belongs to another filter; start again at the first page.
var ErrInvalidCursor = errors.New("payments: invalid page cursor")

// Filter selects payments for the console's list. Every field is optional;
// fields combine with AND.
type Filter struct {
	Status      Status          `json:"status,omitempty"`
	MerchantID  string          `json:"merchant_id,omitempty"`
	InvoiceID   string          `json:"invoice_id,omitempty"`
	OperationID uuid.UUID       `json:"operation_id,omitzero"`
	AmountMin   decimal.Decimal `json:"amount_min,omitzero"` // inclusive; zero: none
	AmountMax   decimal.Decimal `json:"amount_max,omitzero"` // inclusive; zero: none
	CreatedFrom time.Time       `json:"created_from,omitzero"`
	CreatedTo   time.Time       `json:"created_to,omitzero"` // exclusive
}

// Validate reports the first thing wrong with f.
func (f Filter) Validate() error {
	_, err := f.where(pgx.NamedArgs{})
	return err
}

func (f Filter) where(args pgx.NamedArgs) (string, error) {
	var conds []string
	switch f.Status {
	case "", StatusUnknown, StatusProcessing, StatusCompleted, StatusFailed:
	default:
		return "", fmt.Errorf("%w: status %q is not one of unknown, processing, failed, completed", ErrInvalidFilter, f.Status)
	}
	if f.MerchantID != "" {
		conds = append(conds, "p.merchant_id = @f_merchant")
		args["f_merchant"] = f.MerchantID
	}
	if f.InvoiceID != "" {
		conds = append(conds, "p.invoice_id = @f_invoice")
		args["f_invoice"] = f.InvoiceID
	}
	if f.OperationID != uuid.Nil {
		conds = append(conds, "p.operation_id = @f_op")
		args["f_op"] = f.OperationID
	}
	if f.AmountMin.IsNegative() || f.AmountMax.IsNegative() {
		return "", fmt.Errorf("%w: amounts are not negative", ErrInvalidFilter)
	}
	if !f.AmountMin.IsZero() {
		conds = append(conds, "p.amount >= @f_amin::numeric")
		args["f_amin"] = f.AmountMin.String()
	}
	if !f.AmountMax.IsZero() {
		if !f.AmountMin.IsZero() && f.AmountMax.LessThan(f.AmountMin) {
			return "", fmt.Errorf("%w: the amount range ends below where it starts", ErrInvalidFilter)
		}
		conds = append(conds, "p.amount <= @f_amax::numeric")
		args["f_amax"] = f.AmountMax.String()
	}
	if !f.CreatedFrom.IsZero() {
		conds = append(conds, "p.created_at >= @f_from")
		args["f_from"] = f.CreatedFrom
	}
	if !f.CreatedTo.IsZero() {
		if !f.CreatedFrom.IsZero() && !f.CreatedTo.After(f.CreatedFrom) {
			return "", fmt.Errorf("%w: the time range ends before it starts", ErrInvalidFilter)
		}
		conds = append(conds, "p.created_at < @f_to")
		args["f_to"] = f.CreatedTo
	}
	if len(conds) == 0 {
		return "TRUE", nil
	}
	return strings.Join(conds, " AND "), nil
}

// listSegments is the list's order: unknown payments first, oldest unknown
// first (reconcile age), then each other status, newest first.
var listSegments = []Status{StatusUnknown, StatusProcessing, StatusFailed, StatusCompleted}

// Page asks for one page of the list.
type Page struct {
	Limit int    // default 50, at most 500
	After string // the Next of the previous page; "" = the first page
}

// ListPage is one page of payments, the cursor of the next ("" on the last
// page), and the database clock it was read at (ages are measured on it).
type ListPage struct {
	Rows   []Payment
	Next   string
	ReadAt time.Time
}

// ListPayments returns one page of the payments matching f: unknown ones
// first by unknown_since (oldest first), then processing, failed and
// completed ones, each newest first. Each status is one keyset segment read
// along its own index (payment_unknown_idx, payment_status_created_idx, or
// payment_merchant_status_created_idx for a merchant), so a deep page costs
// what the first one does. The cursor is opaque (version, segment, the last
// row's time and id, a fingerprint of the filter) and strictly checked: a
// forged one can only move within the same filtered list.
func ListPayments(ctx context.Context, q db.Querier, f Filter, p Page) (ListPage, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 50
	}
	if limit > 500 {
		return ListPage{}, fmt.Errorf("%w: at most 500 rows per page", ErrInvalidFilter)
	}
	if err := f.Validate(); err != nil {
		return ListPage{}, err
	}
	seg, cur := 0, cursor{}
	if p.After != "" {
		var err error
		if cur, err = decodeListCursor(f, p.After); err != nil {
			return ListPage{}, err
		}
		seg = cur.segment
	}
	var page ListPage
	if err := q.QueryRow(ctx, `SELECT statement_timestamp()`).Scan(&page.ReadAt); err != nil {
		return ListPage{}, fmt.Errorf("payments: list: %w", err)
	}
	var rows []Payment
	var segOf []int
	for ; seg < len(listSegments) && len(rows) <= limit; seg++ {
		status := listSegments[seg]
		if f.Status != "" && f.Status != status {
			continue
		}
		var after *cursor
		if p.After != "" && seg == cur.segment {
			after = &cur
		}
		sql, args := segmentSQL(f, status, after, limit+1-len(rows))
		r, err := q.Query(ctx, sql, db.PlanEachCall, args)
		if err != nil {
			return ListPage{}, fmt.Errorf("payments: list %s: %w", status, err)
		}
		got, err := collectPayments(r, "list "+string(status))
		if err != nil {
			return ListPage{}, err
		}
		for range got {
			segOf = append(segOf, seg)
		}
		rows = append(rows, got...)
	}
	page.Rows = rows
	if len(rows) > limit {
		page.Rows = rows[:limit]
		last := page.Rows[limit-1]
		c := cursor{segment: segOf[limit-1], op: last.OperationID, at: last.CreatedAt}
		if last.Status == StatusUnknown && last.UnknownSince != nil {
			c.at = *last.UnknownSince
		}
		page.Next = encodeListCursor(f, c)
	}
	return page, nil
}

// segmentSQL reads one status's rows after the cursor, in the segment's
// index order.
func segmentSQL(f Filter, status Status, after *cursor, limit int) (string, pgx.NamedArgs) {
	args := pgx.NamedArgs{"limit": limit}
	where, _ := f.where(args) // validated by the caller
	// Status words are literals, so the planner matches the partial index.
	if status == StatusUnknown {
		where += " AND p.status = 'unknown'"
		if after != nil {
			where += " AND (p.unknown_since, p.operation_id) > (@c_at, @c_op)"
			args["c_at"], args["c_op"] = after.at, after.op
		}
		return `SELECT ` + paymentCols + ` FROM payment p WHERE ` + where +
			` ORDER BY p.unknown_since, p.operation_id LIMIT @limit`, args
	}
	where += " AND p.status = '" + string(status) + "'"
	if after != nil {
		// The index is (status, created_at DESC, operation_id): the
		// redundant created_at <= bound is its range condition.
		where += " AND p.created_at <= @c_at AND (p.created_at < @c_at OR p.operation_id > @c_op)"
		args["c_at"], args["c_op"] = after.at, after.op
	}
	return `SELECT ` + paymentCols + ` FROM payment p WHERE ` + where +
		` ORDER BY p.created_at DESC, p.operation_id LIMIT @limit`, args
}

type cursor struct {
	segment int
	at      time.Time
	op      uuid.UUID
}

const listCursorVersion = 1

func listFingerprint(f Filter) [8]byte {
	b, _ := json.Marshal(f) // strings, times, decimals: Marshal cannot fail
	sum := sha256.Sum256(b)
	var fp [8]byte
	copy(fp[:], sum[:8])
	return fp
}

// 1 version + 1 segment + 8 microseconds + 16 id + 8 fingerprint.
const listCursorLen = 34

func encodeListCursor(f Filter, c cursor) string {
	raw := make([]byte, 0, listCursorLen)
	raw = append(raw, listCursorVersion, byte(c.segment))
	raw = binary.BigEndian.AppendUint64(raw, uint64(c.at.UnixMicro()))
	raw = append(raw, c.op[:]...)
	fp := listFingerprint(f)
	raw = append(raw, fp[:]...)
	return base64.RawURLEncoding.EncodeToString(raw)
}

func decodeListCursor(f Filter, token string) (cursor, error) {
	// The length of the text too: the decoder skips line breaks.
	raw, err := base64.RawURLEncoding.Strict().DecodeString(token)
	if err != nil || len(token) != base64.RawURLEncoding.EncodedLen(listCursorLen) || len(raw) != listCursorLen || raw[0] != listCursorVersion || int(raw[1]) >= len(listSegments) {
		return cursor{}, ErrInvalidCursor
	}
	fp := listFingerprint(f)
	if string(raw[26:]) != string(fp[:]) {
		return cursor{}, fmt.Errorf("%w: it belongs to another filter", ErrInvalidCursor)
	}
	c := cursor{segment: int(raw[1]), at: time.UnixMicro(int64(binary.BigEndian.Uint64(raw[2:10]))).UTC()}
	copy(c.op[:], raw[10:26])
	return c, nil
}

// CountExactBelow and Total are db's: every list counts the same way.
const CountExactBelow = db.CountExactBelow

// Total is how many rows match a filter (db.Total).
type Total = db.Total

// CountPayments counts the payments matching f as every list does
// (db.CountTotal): the planner's estimate (EXPLAIN, nothing read) when it is
// above CountExactBelow, flagged Estimate; else a count of at most
// CountExactBelow+1 rows.
func CountPayments(ctx context.Context, q db.Querier, f Filter) (Total, error) {
	args := pgx.NamedArgs{}
	where, err := f.where(args)
	if err != nil {
		return Total{}, err
	}
	if f.Status != "" {
		where += " AND p.status = '" + string(f.Status) + "'"
	}
	total, err := db.CountTotal(ctx, q, `payment p WHERE `+where, args)
	if err != nil {
		return Total{}, fmt.Errorf("payments: %w", err)
	}
	return total, nil
}
