package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
)

// Status filter words beyond the stored status words: a pending event under
// a live lease is in flight; a pending event behind an unfinished (pending
// or dead) earlier event of its aggregate is held; held behind a dead
// letter is the part of those that waits for an operator, the number
// HeldRead counts and the dashboard's tile shows.
const (
	FilterInFlight = "in_flight"
	FilterHeld     = "held"
	FilterHeldDead = "held_dead"
)

// ErrInvalidFilter reports a filter the list cannot run (or cannot run
// cheaply); its text says which field and why, fit for a form error.
var ErrInvalidFilter = errors.New("outbox: invalid filter")

// ErrInvalidCursor reports a page cursor that is malformed, forged, or
// belongs to another filter or sort order; start again at the first page.
var ErrInvalidCursor = errors.New("outbox: invalid page cursor")

// MaxErrorSearchSpan is the widest created range in which the error text may
// be searched among published events (see Filter.ErrorText).
const MaxErrorSearchSpan = time.Hour

// Filter selects outbox events for the console's list, counts and bulk jobs.
// Every field is optional; fields combine with AND.
type Filter struct {
	// Status is "" (any), a stored status word (pending, published, dead,
	// discarded), FilterInFlight or FilterHeld. pending includes in-flight
	// and held events.
	Status        string `json:"status,omitempty"`
	Topic         string `json:"topic,omitempty"`
	EventType     string `json:"event_type,omitempty"`
	AggregateType string `json:"aggregate_type,omitempty"`
	AggregateID   string `json:"aggregate_id,omitempty"` // needs AggregateType
	// IDPrefix is the start of an event id in hex (dashes ignored), e.g. the
	// first 8 characters an operator copied: a range of the primary key.
	IDPrefix string `json:"id_prefix,omitempty"`
	// ErrorText is a case-insensitive substring of last_error. It is an
	// unindexed scan, so it is accepted only within a bound: a status other
	// than published (pending, in flight, held, dead, discarded: partial
	// indexes, O(backlog)), an aggregate id (its events only), or a created
	// range of at most MaxErrorSearchSpan (an id range). A page then reads at
	// most the rows in that bound.
	ErrorText string `json:"error_text,omitempty"`
	// CreatedFrom (inclusive) and CreatedTo (exclusive) bound the creation
	// time carried by the UUIDv7 id (the writer's clock when Insert ran, in
	// milliseconds): the list's own order, so a time range is a range of the
	// primary key and costs no index of its own. created_at (the writing
	// transaction's start on the database clock) differs from it by at most
	// that transaction's length plus clock skew.
	CreatedFrom time.Time `json:"created_from,omitzero"`
	CreatedTo   time.Time `json:"created_to,omitzero"`
	// StateBy (jobs only: lists ignore it) keeps the events that were in
	// the job's status at that time, the dry run's: dead by then for a
	// retry or a discard, published by then for a replay, created by then
	// for a dead-letter (a pending event keeps no time it became pending).
	// A job confirmed from a dry run acts on what that dry run showed, not
	// on events that died or were published after it.
	StateBy *time.Time `json:"state_by,omitempty"`
}

// Validate reports the first thing wrong with f.
func (f Filter) Validate() error {
	_, err := f.where(pgx.NamedArgs{})
	return err
}

// statusCond is the SQL for a status filter: literal status words (never
// parameters), so the planner matches the partial indexes even in a generic
// plan of a prepared statement.
func statusCond(status string) (string, error) {
	switch status {
	case "":
		return "", nil
	case StatusPending, StatusPublished, StatusDead, StatusDiscarded:
		return "e.status = '" + status + "'", nil
	case FilterInFlight:
		return "e.status = 'pending' AND e.locked_until > clock_timestamp()", nil
	case FilterHeld:
		return "e.status = 'pending' AND " + heldExpr, nil
	case FilterHeldDead:
		return "e.status = 'pending' AND " + heldDeadExpr, nil
	}
	return "", fmt.Errorf("%w: status %q is not one of pending, in_flight, held, held_dead, dead, discarded, published", ErrInvalidFilter, status)
}

// heldDeadExpr: an earlier dead event of e's aggregate exists (one probe of
// outbox_event_pending_aggregate_idx): HeldRead's definition.
const heldDeadExpr = `EXISTS (SELECT 1 FROM outbox_event h
	         WHERE h.status = 'dead'
	           AND h.aggregate_type = e.aggregate_type AND h.aggregate_id = e.aggregate_id
	           AND h.aggregate_seq < e.aggregate_seq)`

// heldExpr: an earlier unfinished event of e's aggregate exists (one probe of
// outbox_event_pending_aggregate_idx).
const heldExpr = `EXISTS (SELECT 1 FROM outbox_event h
	         WHERE h.status IN ('pending', 'dead')
	           AND h.aggregate_type = e.aggregate_type AND h.aggregate_id = e.aggregate_id
	           AND h.aggregate_seq < e.aggregate_seq)`

// heldDeadFrom is the held_dead filter read from the dead letters rather
// than from the pending events: each aggregate's first dead event
// (outbox_event_dead_aggregate_idx, in aggregate order), then the events of
// its aggregate after it (one range of outbox_event_pending_aggregate_idx),
// as e. With the filter's other conditions and e.status = 'pending' it is
// heldDeadExpr's set: a pending event with an earlier dead event in its
// aggregate is one after its aggregate's first dead event. It reads
// O(dead aggregates + held events), where heldDeadExpr walks the pending
// events and probes each: with one poison message in a backlog of a
// million, a million probes to find its few held events.
const heldDeadFrom = `(SELECT DISTINCT ON (aggregate_type, aggregate_id) aggregate_type, aggregate_id, aggregate_seq
	          FROM outbox_event WHERE status = 'dead'
	         ORDER BY aggregate_type, aggregate_id, aggregate_seq) d
	 CROSS JOIN LATERAL (SELECT e.* FROM outbox_event e
	         WHERE e.aggregate_type = d.aggregate_type AND e.aggregate_id = d.aggregate_id
	           AND e.aggregate_seq > d.aggregate_seq) e`

// fromWhere is `FROM … WHERE …` for f on e: from the dead letters when
// byDead and f is the held_dead filter (heldDeadFrom), else from
// outbox_event.
func (f Filter) fromWhere(args pgx.NamedArgs, byDead bool) (string, error) {
	if byDead && f.Status == FilterHeldDead {
		f.Status = StatusPending
		where, err := f.where(args)
		return heldDeadFrom + "\n\t WHERE " + where, err
	}
	where, err := f.where(args)
	return "outbox_event e\n\t WHERE " + where, err
}

// where builds f's conditions on outbox_event e, adding its parameters to
// args. It returns "TRUE" for an empty filter.
func (f Filter) where(args pgx.NamedArgs) (string, error) {
	var conds []string
	sc, err := statusCond(f.Status)
	if err != nil {
		return "", err
	}
	if sc != "" {
		conds = append(conds, sc)
	}
	if f.Topic != "" {
		conds = append(conds, "e.topic = @f_topic")
		args["f_topic"] = f.Topic
	}
	if f.EventType != "" {
		conds = append(conds, "e.event_type = @f_event_type")
		args["f_event_type"] = f.EventType
	}
	if f.AggregateID != "" && f.AggregateType == "" {
		return "", fmt.Errorf("%w: an aggregate id needs its aggregate type", ErrInvalidFilter)
	}
	if f.AggregateType != "" {
		conds = append(conds, "e.aggregate_type = @f_agg_type")
		args["f_agg_type"] = f.AggregateType
	}
	if f.AggregateID != "" {
		conds = append(conds, "e.aggregate_id = @f_agg_id")
		args["f_agg_id"] = f.AggregateID
	}
	if f.IDPrefix != "" {
		lo, hi, err := idPrefixRange(f.IDPrefix)
		if err != nil {
			return "", err
		}
		conds = append(conds, "e.id BETWEEN @f_id_lo AND @f_id_hi")
		args["f_id_lo"], args["f_id_hi"] = lo, hi
	}
	if !f.CreatedFrom.IsZero() {
		conds = append(conds, "e.id >= @f_from")
		args["f_from"] = v7Floor(f.CreatedFrom)
	}
	if !f.CreatedTo.IsZero() {
		if !f.CreatedFrom.IsZero() && !f.CreatedTo.After(f.CreatedFrom) {
			return "", fmt.Errorf("%w: the created range ends before it starts", ErrInvalidFilter)
		}
		conds = append(conds, "e.id < @f_to")
		args["f_to"] = v7Floor(f.CreatedTo)
	}
	if f.ErrorText != "" {
		bounded := (f.Status != "" && f.Status != StatusPublished) || f.AggregateID != "" ||
			(!f.CreatedFrom.IsZero() && !f.CreatedTo.IsZero() && f.CreatedTo.Sub(f.CreatedFrom) <= MaxErrorSearchSpan)
		if !bounded {
			return "", fmt.Errorf("%w: searching the error text needs a status other than published, an aggregate id, or a created range of at most %s", ErrInvalidFilter, MaxErrorSearchSpan)
		}
		conds = append(conds, `e.last_error ILIKE @f_error ESCAPE '\'`)
		args["f_error"] = "%" + likeEscaper.Replace(f.ErrorText) + "%"
	}
	if len(conds) == 0 {
		return "TRUE", nil
	}
	return strings.Join(conds, "\n\t   AND "), nil
}

var likeEscaper = strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)

// idPrefixRange turns a hex prefix into the smallest and largest ids with it.
func idPrefixRange(prefix string) (uuid.UUID, uuid.UUID, error) {
	p := strings.ToLower(strings.ReplaceAll(strings.TrimSpace(prefix), "-", ""))
	if len(p) == 0 || len(p) > 32 {
		return uuid.Nil, uuid.Nil, fmt.Errorf("%w: id prefix must be 1–32 hex digits", ErrInvalidFilter)
	}
	if _, err := hex.DecodeString(p + strings.Repeat("0", len(p)%2)); err != nil {
		return uuid.Nil, uuid.Nil, fmt.Errorf("%w: id prefix %q is not hex", ErrInvalidFilter, prefix)
	}
	lo, err := uuid.Parse(expandHex(p + strings.Repeat("0", 32-len(p))))
	if err != nil {
		return uuid.Nil, uuid.Nil, fmt.Errorf("%w: id prefix: %v", ErrInvalidFilter, err)
	}
	hi, err := uuid.Parse(expandHex(p + strings.Repeat("f", 32-len(p))))
	if err != nil {
		return uuid.Nil, uuid.Nil, fmt.Errorf("%w: id prefix: %v", ErrInvalidFilter, err)
	}
	return lo, hi, nil
}

func expandHex(h string) string {
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// v7Floor is the smallest UUIDv7 of t's millisecond: every id made at or
// after that millisecond sorts at or after it.
func v7Floor(t time.Time) uuid.UUID {
	var u uuid.UUID
	ms := uint64(t.UnixMilli())
	u[0], u[1], u[2], u[3], u[4], u[5] = byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms)
	return u
}

// Page asks for one page of a list.
type Page struct {
	Limit  int    // rows per page: default 50, at most MaxPageRows
	After  string // the Next of the previous page; "" = first page
	Oldest bool   // oldest first (default: newest first)
}

// MaxPageRows bounds a page.
const MaxPageRows = 500

// ListRow is one event in a list: no payload or headers.
type ListRow struct {
	ID            uuid.UUID
	Topic         string
	EventType     string
	AggregateType string
	AggregateID   string
	AggregateSeq  int64
	Attempts      int
	CreatedAt     time.Time
	Status        string
	InFlight      bool // pending under a live relay lease (database clock)
	Held          bool // pending behind an unfinished earlier event of its aggregate
	// LastError is the start of the last publish error (at most
	// listErrorChars characters). Attacker-reachable text: escape it.
	LastError string
}

const listErrorChars = 200

// ListPage is one page and the cursor of the next ("" on the last page).
type ListPage struct {
	Rows []ListRow
	Next string
}

// List returns one page of the events matching f, in id order (UUIDv7:
// creation order), newest first unless p.Oldest. Pages are keyset pages:
// each continues after the previous page's last id (p.After), so a deep page
// costs what the first one does, reading the same index (the status
// partial index, (topic, id), (event_type, id), the aggregate index or the
// primary key, whichever the filter names).
//
// The cursor is opaque: base64url of a version byte, the sort order, the
// last id and a fingerprint of the filter, strictly checked on the way in
// (ErrInvalidCursor). It needs no HMAC: a cursor is only a position, the
// server applies the filter it is given to every page, and every id is a
// position a user may reach by paging, so a forged cursor can only move
// within the same list; it never widens the filter, reaches another user's
// data or enters SQL (it is parsed into 16 bytes and bound). The fingerprint
// catches a cursor used with another filter (a stale link), so the page
// says "start again" instead of showing a confusing slice.
func List(ctx context.Context, q db.Querier, f Filter, p Page) (ListPage, error) {
	byDead, err := listByDead(ctx, q, f, p)
	if err != nil {
		return ListPage{}, err
	}
	sql, args, limit, err := listSQL(f, p, byDead)
	if err != nil {
		return ListPage{}, err
	}
	rows, err := q.Query(ctx, sql, db.PlanEachCall, args)
	if err != nil {
		return ListPage{}, fmt.Errorf("outbox: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanListRow)
	if err != nil {
		return ListPage{}, fmt.Errorf("outbox: list: %w", err)
	}
	page := ListPage{Rows: out}
	if len(out) > limit {
		page.Rows = out[:limit]
		page.Next = encodeCursor(f, p.Oldest, page.Rows[limit-1].ID)
	}
	return page, nil
}

// scanListRow reads a row of listSQL.
func scanListRow(r pgx.CollectableRow) (ListRow, error) {
	var l ListRow
	err := r.Scan(&l.ID, &l.Topic, &l.EventType, &l.AggregateType, &l.AggregateID, &l.AggregateSeq,
		&l.Attempts, &l.CreatedAt, &l.Status, &l.InFlight, &l.Held, &l.LastError)
	return l, err
}

// listByDead says whether List reads f from the dead letters: a held_dead
// filter whose events are few (at most CountExactBelow after p's cursor),
// since the page sorts them all, a cost that grows with them. Many held
// events are dense enough among the pending ones for the walk of the
// pending index to find a page soon.
func listByDead(ctx context.Context, q db.Querier, f Filter, p Page) (bool, error) {
	if f.Status != FilterHeldDead {
		return false, nil
	}
	n, err := countHeldDead(ctx, q, f, p, CountExactBelow)
	return n <= CountExactBelow, err
}

// countHeldDead counts f's held_dead events after p's cursor from the dead
// letters, up to most+1.
func countHeldDead(ctx context.Context, q db.Querier, f Filter, p Page, most int64) (int64, error) {
	args := pgx.NamedArgs{"most": most + 1}
	fw, err := f.fromWhere(args, true)
	if err != nil {
		return 0, err
	}
	fw, err = afterCursor(fw, args, f, p)
	if err != nil {
		return 0, err
	}
	var n int64
	if err := q.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+fw+` LIMIT @most) s`, db.PlanEachCall, args).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: list: count held events: %w", err)
	}
	return n, nil
}

// afterCursor adds p's cursor, if any, to the conditions of fw.
func afterCursor(fw string, args pgx.NamedArgs, f Filter, p Page) (string, error) {
	if p.After == "" {
		return fw, nil
	}
	after, err := decodeCursor(f, p.Oldest, p.After)
	if err != nil {
		return "", err
	}
	cmp := "<"
	if p.Oldest {
		cmp = ">"
	}
	args["after"] = after
	return fw + "\n\t   AND e.id " + cmp + " @after", nil
}

// listSQL is List's statement (and the plan test's); byDead: a held_dead
// filter is read from the dead letters (heldDeadFrom).
func listSQL(f Filter, p Page, byDead bool) (string, pgx.NamedArgs, int, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 50
	}
	if limit > MaxPageRows {
		return "", nil, 0, fmt.Errorf("%w: at most %d rows per page", ErrInvalidFilter, MaxPageRows)
	}
	args := pgx.NamedArgs{"limit": limit + 1}
	fw, err := f.fromWhere(args, byDead)
	if err != nil {
		return "", nil, 0, err
	}
	if fw, err = afterCursor(fw, args, f, p); err != nil {
		return "", nil, 0, err
	}
	order := "DESC"
	if p.Oldest {
		order = "ASC"
	}
	return `
	SELECT e.id, e.topic, e.event_type, e.aggregate_type, e.aggregate_id, e.aggregate_seq,
	       e.attempts, e.created_at, e.status,
	       coalesce(e.status = 'pending' AND e.locked_until > clock_timestamp(), false),
	       e.status = 'pending' AND ` + heldExpr + `,
	       left(coalesce(e.last_error, ''), ` + fmt.Sprint(listErrorChars) + `)
	  FROM ` + fw + `
	 ORDER BY e.id ` + order + `
	 LIMIT @limit`, args, limit, nil
}

const cursorVersion = 1

// fingerprint identifies a filter and sort order in a cursor.
func fingerprint(f Filter, oldest bool) [8]byte {
	b, _ := json.Marshal(struct {
		F      Filter
		Oldest bool
	}{f, oldest}) // a struct of strings and times: Marshal cannot fail
	sum := sha256.Sum256(b)
	var fp [8]byte
	copy(fp[:], sum[:8])
	return fp
}

func encodeCursor(f Filter, oldest bool, last uuid.UUID) string {
	raw := make([]byte, 0, 26)
	raw = append(raw, cursorVersion, 0)
	if oldest {
		raw[1] = 1
	}
	raw = append(raw, last[:]...)
	fp := fingerprint(f, oldest)
	raw = append(raw, fp[:]...)
	return base64.RawURLEncoding.EncodeToString(raw)
}

func decodeCursor(f Filter, oldest bool, token string) (uuid.UUID, error) {
	// The length of the text too: the decoder skips line breaks.
	raw, err := base64.RawURLEncoding.Strict().DecodeString(token)
	if err != nil || len(token) != base64.RawURLEncoding.EncodedLen(26) || len(raw) != 26 || raw[0] != cursorVersion || raw[1] > 1 {
		return uuid.Nil, ErrInvalidCursor
	}
	if (raw[1] == 1) != oldest {
		return uuid.Nil, fmt.Errorf("%w: it belongs to the other sort order", ErrInvalidCursor)
	}
	fp := fingerprint(f, oldest)
	if binary.BigEndian.Uint64(raw[18:]) != binary.BigEndian.Uint64(fp[:]) {
		return uuid.Nil, fmt.Errorf("%w: it belongs to another filter", ErrInvalidCursor)
	}
	var id uuid.UUID
	copy(id[:], raw[2:18])
	return id, nil
}

// CountExactBelow and Total are db's: every list counts the same way.
const CountExactBelow = db.CountExactBelow

// Total is how many rows match a filter (db.Total).
type Total = db.Total

// Count counts the events matching f as every list does (db.CountTotal):
// the planner's row estimate for the filter (EXPLAIN, nothing read) when it
// is above CountExactBelow, flagged Estimate; else a count over a LIMIT'd
// subquery, which reads at most CountExactBelow+1 rows and says MoreThan
// when it reaches them. Tens of millions of rows are never counted for a
// page header.
//
// In flight, held, held_dead and an error text are counted first
// (db.CountUpTo): the planner has no statistics for a lease against the
// clock, an EXISTS or a substring, and guesses a fixed share of the rows
// (15,000 in flight where 500 were). Those filters are bounded to the
// backlog, the dead letters or a short range, and read at most the cap.
func Count(ctx context.Context, q db.Querier, f Filter) (Total, error) {
	args := pgx.NamedArgs{}
	fw, err := f.fromWhere(args, true) // held_dead from the dead letters: reads at most CountExactBelow held events
	if err != nil {
		return Total{}, err
	}
	count := db.CountTotal
	switch {
	case f.Status == FilterInFlight, f.Status == FilterHeld, f.Status == FilterHeldDead, f.ErrorText != "":
		count = func(ctx context.Context, q db.Querier, fw string, args pgx.NamedArgs) (Total, error) {
			return db.CountUpTo(ctx, q, fw, args, CountExactBelow)
		}
	}
	total, err := count(ctx, q, fw, args)
	if err != nil {
		return Total{}, fmt.Errorf("outbox: %w", err)
	}
	return total, nil
}

// EventDetail is everything the console shows about one event.
type EventDetail struct {
	Row
	InFlight bool // pending under a live relay lease (database clock)
	// Prev and Next are the aggregate's neighbouring events by sequence
	// (nil at either end, or pruned).
	Prev, Next *Ref
	Hold       // what holds this event back and how many it holds
	ReadAt     time.Time
}

// Detail reads one event with its neighbours and holds; the payload is
// raw (sensitive fields are as Insert stored them, encrypted). Missing:
// ErrNotFound.
func Detail(ctx context.Context, q db.Querier, id uuid.UUID) (EventDetail, error) {
	var (
		d            EventDetail
		pID, nID     *uuid.UUID
		pSeq, nSeq   *int64
		pStat, nStat *string
		heldID       *uuid.UUID
		heldSeq      *int64
		heldStat     *string
		holds        *int64
	)
	targets := append(d.Row.scanTargets(), &d.InFlight, &d.ReadAt, &pID, &pSeq, &pStat, &nID, &nSeq, &nStat, &heldID, &heldSeq, &heldStat, &holds)
	err := q.QueryRow(ctx, detailSQL, id).Scan(targets...)
	if errors.Is(err, pgx.ErrNoRows) {
		return EventDetail{}, ErrNotFound
	}
	if err != nil {
		return EventDetail{}, fmt.Errorf("outbox: detail of %s: %w", id, err)
	}
	if pID != nil {
		d.Prev = &Ref{ID: *pID, Seq: *pSeq, Status: *pStat}
	}
	if nID != nil {
		d.Next = &Ref{ID: *nID, Seq: *nSeq, Status: *nStat}
	}
	if heldID != nil {
		d.HeldBy = &Ref{ID: *heldID, Seq: *heldSeq, Status: *heldStat}
	}
	if holds != nil {
		d.Holds = *holds
	}
	return d, nil
}

// detailSQL reads the event and, through the aggregate indexes, its
// neighbours by sequence, the first unfinished event before it and the count
// of unfinished events after it.
var detailSQL = `
	SELECT ` + qualified("e", rowColumns) + `,
	       coalesce(e.status = 'pending' AND e.locked_until > clock_timestamp(), false), clock_timestamp(),
	       p.id, p.aggregate_seq, p.status, n.id, n.aggregate_seq, n.status,
	       h.id, h.aggregate_seq, h.status,
	       CASE WHEN e.status IN ('pending', 'dead') THEN
	            (SELECT count(*) FROM outbox_event l
	              WHERE l.status IN ('pending', 'dead')
	                AND l.aggregate_type = e.aggregate_type AND l.aggregate_id = e.aggregate_id
	                AND l.aggregate_seq > e.aggregate_seq) END
	  FROM outbox_event e
	  LEFT JOIN LATERAL (SELECT id, aggregate_seq, status FROM outbox_event x
	         WHERE x.aggregate_type = e.aggregate_type AND x.aggregate_id = e.aggregate_id
	           AND x.aggregate_seq < e.aggregate_seq ORDER BY x.aggregate_seq DESC LIMIT 1) p ON true
	  LEFT JOIN LATERAL (SELECT id, aggregate_seq, status FROM outbox_event x
	         WHERE x.aggregate_type = e.aggregate_type AND x.aggregate_id = e.aggregate_id
	           AND x.aggregate_seq > e.aggregate_seq ORDER BY x.aggregate_seq LIMIT 1) n ON true
	  LEFT JOIN LATERAL (SELECT id, aggregate_seq, status FROM outbox_event b
	         WHERE e.status IN ('pending', 'dead') AND b.status IN ('pending', 'dead')
	           AND b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
	           AND b.aggregate_seq < e.aggregate_seq ORDER BY b.aggregate_seq LIMIT 1) h ON true
	 WHERE e.id = $1`

// qualified prefixes each column of a comma-separated list with alias.
func qualified(alias, cols string) string {
	parts := strings.Split(cols, ",")
	for i, c := range parts {
		parts[i] = alias + "." + strings.TrimSpace(c)
	}
	return strings.Join(parts, ", ")
}
