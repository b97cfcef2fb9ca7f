package audit

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
)

// ErrInvalidFilter reports a filter the list cannot run; its text says which
// field and why, fit for a form.
var ErrInvalidFilter = errors.New("audit: invalid filter")

// ErrInvalidCursor reports a page cursor that is malformed or belongs to
// another filter: start again at the first page.
var ErrInvalidCursor = errors.New("audit: invalid page cursor")

// ErrNotFound reports an audit row that does not exist.
var ErrNotFound = errors.New("audit: not found")

// Filter selects audit rows for the console's list and export. Every field
// is optional; fields combine with AND. Each one is served by an index
// (migrations 00001 and 00014), so a page costs its rows whatever the size
// of the trail.
type Filter struct {
	// Actor is a subject or a display name, matched exactly.
	Actor      string `json:"actor,omitempty"`
	Action     string `json:"action,omitempty"`
	TargetType string `json:"target_type,omitempty"`
	TargetID   string `json:"target_id,omitempty"` // needs TargetType
	Outcome    string `json:"outcome,omitempty"`   // ok, denied or error
	// From (inclusive) and To (exclusive) bound occurred_at.
	From time.Time `json:"from,omitzero"`
	To   time.Time `json:"to,omitzero"`
}

// Validate reports the first thing wrong with f.
func (f Filter) Validate() error {
	switch f.Outcome {
	case "", OutcomeOK, OutcomeDenied, OutcomeError:
	default:
		return fmt.Errorf("%w: outcome must be ok, denied or error", ErrInvalidFilter)
	}
	if f.TargetID != "" && f.TargetType == "" {
		return fmt.Errorf("%w: a target id needs its target type", ErrInvalidFilter)
	}
	if !f.From.IsZero() && !f.To.IsZero() && !f.To.After(f.From) {
		return fmt.Errorf("%w: the time range ends before it starts", ErrInvalidFilter)
	}
	return nil
}

// where builds f's conditions on audit_event e. The time range becomes a
// range of seq as well (seqRange), so a page walks the primary key between
// two bounds instead of scanning for the range.
func (f Filter) where(ctx context.Context, q db.Querier, args pgx.NamedArgs) (string, error) {
	if err := f.Validate(); err != nil {
		return "", err
	}
	conds := []string{"TRUE"}
	add := func(cond, name string, v any) {
		conds = append(conds, cond)
		args[name] = v
	}
	if f.Actor != "" {
		add("(e.actor_sub = @f_actor OR e.actor_name = @f_actor)", "f_actor", f.Actor)
	}
	if f.Action != "" {
		add("e.action = @f_action", "f_action", f.Action)
	}
	if f.TargetType != "" {
		add("e.target_type = @f_target_type", "f_target_type", f.TargetType)
	}
	if f.TargetID != "" {
		add("e.target_id = @f_target_id", "f_target_id", f.TargetID)
	}
	if f.Outcome != "" {
		// A literal (validated above): the word is part of the plan.
		conds = append(conds, "e.outcome = '"+f.Outcome+"'")
	}
	if !f.From.IsZero() || !f.To.IsZero() {
		lo, hi, err := seqRange(ctx, q, f.From, f.To)
		if err != nil {
			return "", err
		}
		add("e.seq >= @f_seq_lo AND e.seq < @f_seq_hi", "f_seq_lo", lo)
		args["f_seq_hi"] = hi
	}
	if !f.From.IsZero() {
		add("e.occurred_at >= @f_from", "f_from", f.From)
	}
	if !f.To.IsZero() {
		add("e.occurred_at < @f_to", "f_to", f.To)
	}
	return strings.Join(conds, "\n\t   AND "), nil
}

// seqRange is the range of seq [lo, hi) of the rows that occurred in
// [from, to): one probe of audit_event_occurred_idx at each end. Appends are
// serialized and take seq and the clock under the chain lock, so seq order is
// occurred_at order; the list keeps its occurred_at conditions besides, so no
// row outside the range is ever shown.
func seqRange(ctx context.Context, q db.Querier, from, to time.Time) (lo, hi int64, err error) {
	lo, hi = 0, math.MaxInt64
	first := `SELECT coalesce((SELECT seq FROM audit_event WHERE occurred_at >= $1 ORDER BY occurred_at LIMIT 1), $2)`
	if !from.IsZero() {
		if err := q.QueryRow(ctx, first, from, int64(math.MaxInt64)).Scan(&lo); err != nil {
			return 0, 0, fmt.Errorf("audit: time range: %w", err)
		}
	}
	if !to.IsZero() {
		if err := q.QueryRow(ctx, first, to, int64(math.MaxInt64)).Scan(&hi); err != nil {
			return 0, 0, fmt.Errorf("audit: time range: %w", err)
		}
	}
	return lo, hi, nil
}

// ListRow is one audit row in the list: who did what to which target, when,
// with which outcome (the reason cut to listReasonChars characters).
// Actor names, target ids, reasons and error codes are attacker-reachable
// text: escape them.
type ListRow struct {
	Seq        int64
	OccurredAt time.Time
	ActorSub   string
	ActorName  string
	ActorRoles []string
	Action     string
	TargetType string
	TargetID   string
	Reason     string
	Outcome    string
	ErrorCode  string
}

const listReasonChars = 200

// MaxPageRows bounds a page.
const MaxPageRows = 500

// Page asks for one page of the list (newest first).
type Page struct {
	Limit int    // rows per page: default 50, at most MaxPageRows
	After string // the Next of the previous page; "" = first page
}

// ListPage is one page and the cursor of the next ("" on the last page).
type ListPage struct {
	Rows []ListRow
	Next string
}

// List returns one page of the rows matching f, newest first. Pages are
// keyset pages by seq: each continues below the previous page's last seq,
// so a deep page costs what the first does and paging never repeats or
// skips a row, even while rows are appended.
//
// The cursor is opaque (base64url of a version byte, the last seq and a
// fingerprint of the filter) and strictly checked (ErrInvalidCursor). It
// needs no MAC: it is only a position inside the same filter, which the
// server applies to every page.
func List(ctx context.Context, q db.Querier, f Filter, p Page) (ListPage, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 50
	}
	if limit > MaxPageRows {
		return ListPage{}, fmt.Errorf("%w: at most %d rows per page", ErrInvalidFilter, MaxPageRows)
	}
	var after int64
	if p.After != "" {
		var err error
		if after, err = decodeCursor(f, p.After); err != nil {
			return ListPage{}, err
		}
	}
	sql, args, err := listSQL(ctx, q, f, p.After != "", after, limit)
	if err != nil {
		return ListPage{}, err
	}
	rows, err := q.Query(ctx, sql, db.PlanEachCall, args)
	if err != nil {
		return ListPage{}, fmt.Errorf("audit: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ListRow, error) {
		var l ListRow
		err := r.Scan(&l.Seq, &l.OccurredAt, &l.ActorSub, &l.ActorName, &l.ActorRoles, &l.Action, &l.TargetType,
			&l.TargetID, &l.Reason, &l.Outcome, &l.ErrorCode)
		return l, err
	})
	if err != nil {
		return ListPage{}, fmt.Errorf("audit: list: %w", err)
	}
	page := ListPage{Rows: out}
	if len(out) > limit {
		page.Rows = out[:limit]
		page.Next = encodeCursor(f, page.Rows[limit-1].Seq)
	}
	return page, nil
}

// listSQL is List's statement (and the plan test's).
func listSQL(ctx context.Context, q db.Querier, f Filter, paged bool, after int64, limit int) (string, pgx.NamedArgs, error) {
	args := pgx.NamedArgs{"limit": limit + 1}
	where, err := f.where(ctx, q, args)
	if err != nil {
		return "", nil, err
	}
	if paged {
		where += "\n\t   AND e.seq < @after"
		args["after"] = after
	}
	return `
	SELECT e.seq, e.occurred_at, e.actor_sub, e.actor_name, e.actor_roles, e.action, e.target_type, e.target_id,
	       left(e.reason, ` + fmt.Sprint(listReasonChars) + `), e.outcome, e.error_code
	  FROM audit_event e
	 WHERE ` + where + `
	 ORDER BY e.seq DESC
	 LIMIT @limit`, args, nil
}

const cursorVersion = 1

func fingerprint(f Filter) uint64 {
	b, _ := json.Marshal(f) // strings and times: Marshal cannot fail
	sum := sha256.Sum256(b)
	return binary.BigEndian.Uint64(sum[:8])
}

func encodeCursor(f Filter, seq int64) string {
	raw := make([]byte, 17)
	raw[0] = cursorVersion
	binary.BigEndian.PutUint64(raw[1:], uint64(seq))
	binary.BigEndian.PutUint64(raw[9:], fingerprint(f))
	return base64.RawURLEncoding.EncodeToString(raw)
}

func decodeCursor(f Filter, token string) (int64, error) {
	// The length of the text too: the decoder skips line breaks.
	raw, err := base64.RawURLEncoding.Strict().DecodeString(token)
	if err != nil || len(token) != base64.RawURLEncoding.EncodedLen(17) || len(raw) != 17 || raw[0] != cursorVersion {
		return 0, ErrInvalidCursor
	}
	seq := int64(binary.BigEndian.Uint64(raw[1:]))
	if seq <= 0 {
		return 0, ErrInvalidCursor
	}
	if binary.BigEndian.Uint64(raw[9:]) != fingerprint(f) {
		return 0, fmt.Errorf("%w: it belongs to another filter", ErrInvalidCursor)
	}
	return seq, nil
}

// CountExactBelow and Total are db's: every list counts the same way.
const CountExactBelow = db.CountExactBelow

// Total is how many rows match a filter (db.Total).
type Total = db.Total

// Count counts the rows matching f as every list does (db.CountTotal):
// the planner's estimate when it is above CountExactBelow, else a count of
// at most CountExactBelow+1 rows.
func Count(ctx context.Context, q db.Querier, f Filter) (Total, error) {
	fw, args, err := countFrom(ctx, q, f)
	if err != nil {
		return Total{}, err
	}
	total, err := db.CountTotal(ctx, q, fw, args)
	if err != nil {
		return Total{}, fmt.Errorf("audit: count: %w", err)
	}
	return total, nil
}

// countFrom is what Count counts: `audit_event e WHERE …` for f, and its
// arguments.
func countFrom(ctx context.Context, q db.Querier, f Filter) (string, pgx.NamedArgs, error) {
	args := pgx.NamedArgs{}
	where, err := f.where(ctx, q, args)
	return `audit_event e WHERE ` + where, args, err
}

// Stored is one whole audit row as stored: the event (its Before and After
// as normalized jsonb text), its place in the chain and its hashes.
type Stored struct {
	Event
	Seq        int64
	OccurredAt time.Time
	PrevHash   []byte
	Hash       []byte
}

// storedColumns are a Stored row as scanStored reads it.
// (on audit_event e).
const storedColumns = `e.seq, e.occurred_at, e.actor_iss, e.actor_sub, e.actor_name, e.actor_roles, e.action,
	e.target_type, e.target_id, e.before::text, e.after::text, e.reason, e.evidence, e.request_id,
	e.session_hash, e.ip, e.user_agent, e.outcome, e.error_code, e.prev_hash, e.hash`

func scanStored(r pgx.Row, s *Stored) error {
	var before, after *string
	err := r.Scan(&s.Seq, &s.OccurredAt, &s.ActorIss, &s.ActorSub, &s.ActorName, &s.ActorRoles,
		&s.Action, &s.TargetType, &s.TargetID, &before, &after, &s.Reason, &s.Evidence,
		&s.RequestID, &s.SessionHash, &s.IP, &s.UserAgent, &s.Outcome, &s.ErrorCode, &s.PrevHash, &s.Hash)
	s.Before, s.After = nil, nil // masked when written; nil for NULL
	if before != nil {
		s.Before = json.RawMessage(*before)
	}
	if after != nil {
		s.After = json.RawMessage(*after)
	}
	return err
}

// Get reads one row by seq; ErrNotFound when there is none.
func Get(ctx context.Context, q db.Querier, seq int64) (Stored, error) {
	var s Stored
	err := scanStored(q.QueryRow(ctx, `SELECT `+storedColumns+` FROM audit_event e WHERE e.seq = $1`, seq), &s)
	if errors.Is(err, pgx.ErrNoRows) {
		return Stored{}, ErrNotFound
	}
	if err != nil {
		return Stored{}, fmt.Errorf("audit: row %d: %w", seq, err)
	}
	return s, nil
}
