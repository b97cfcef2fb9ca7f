package outbox

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
)

// Payloads carry sealed fields (internal/pii envelopes) that a key rotation
// rewrites in place. The outbox knows nothing of keys: it selects rows by
// substrings of their payload text and hands each payload to the caller,
// which returns the new one (`console pii rotate` passes pii's reseal).
// Writers seal before Insert, giving the event's id in Event.ID, because
// the sealed fields are bound to it.

// PayloadMatch selects events by their payload's text: those that contain
// Any and, when Current is set, contain it fewer times than Any (a payload
// with a sealed value that is not current).
type PayloadMatch struct {
	Any     string // e.g. `"enc:v`: the start of any sealed value
	Current string // e.g. `"enc:v2:k1:`: the start of a current one
}

// PayloadRow is one event's payload and what it is bound to.
type PayloadRow struct {
	ID        uuid.UUID
	EventType string
	Payload   json.RawMessage
}

// RewriteOptions tune RewritePayloads.
type RewriteOptions struct {
	Batch  int  // events per transaction (default 500)
	DryRun bool // call fn, write nothing
	// Progress, when set, is called after each batch with the events
	// visited so far.
	Progress func(done int64)
}

// payloadMatch is the WHERE clause of a match: $1 Any, $2 Current.
const payloadMatch = `strpos(payload::text, $1) > 0 AND ($2 = '' OR
	(length(payload::text) - length(replace(payload::text, $1, ''))) / length($1) >
	(length(payload::text) - length(replace(payload::text, $2, ''))) / greatest(length($2), 1))`

// CountPayloads counts the events m selects.
func CountPayloads(ctx context.Context, q db.Querier, m PayloadMatch) (int64, error) {
	if m.Any == "" {
		return 0, fmt.Errorf("outbox: count payloads: the match needs Any")
	}
	var n int64
	if err := q.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE `+payloadMatch, m.Any, m.Current).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: count payloads: %w", err)
	}
	return n, nil
}

// RewritePayloads walks the events m selects, in id order, opts.Batch per
// short transaction with the rows locked (a relay skips them for that
// moment; its lease and status are never touched), and stores what fn
// returns for each: nil leaves the payload as it is. Work committed stays
// committed when ctx ends; since rewritten rows no longer match, running
// it again resumes where it stopped. It returns the events visited and
// rewritten.
func RewritePayloads(ctx context.Context, b db.Beginner, m PayloadMatch, opts RewriteOptions, fn func(PayloadRow) ([]byte, error)) (visited, rewritten int64, err error) {
	if m.Any == "" {
		return 0, 0, fmt.Errorf("outbox: rewrite payloads: the match needs Any")
	}
	if opts.Batch == 0 {
		opts.Batch = 500
	}
	if opts.Batch < 0 || opts.Batch > db.MaxDeleteBatch {
		return 0, 0, fmt.Errorf("outbox: rewrite payloads: batch must be 1–%d events (got %d)", db.MaxDeleteBatch, opts.Batch)
	}
	lock := " FOR NO KEY UPDATE"
	if opts.DryRun {
		lock = ""
	}
	after := uuid.Nil
	for {
		n := 0
		err := db.WithTx(ctx, b, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `SELECT id, event_type, payload FROM outbox_event
				WHERE id > $3 AND `+payloadMatch+` ORDER BY id LIMIT $4`+lock, m.Any, m.Current, after, opts.Batch)
			if err != nil {
				return err
			}
			batch, err := pgx.CollectRows(rows, pgx.RowToStructByPos[PayloadRow])
			if err != nil {
				return err
			}
			n = len(batch)
			for _, r := range batch {
				after = r.ID
				visited++
				out, err := fn(r)
				if err != nil {
					return fmt.Errorf("event %s: %w", r.ID, err)
				}
				if out == nil {
					continue
				}
				rewritten++
				if opts.DryRun {
					continue
				}
				if _, err := tx.Exec(ctx, `UPDATE outbox_event SET payload = $2 WHERE id = $1`, r.ID, []byte(out)); err != nil {
					return fmt.Errorf("update %s: %w", r.ID, err)
				}
			}
			return nil
		})
		if err != nil {
			return visited, rewritten, fmt.Errorf("outbox: rewrite payloads after %s: %w", after, err)
		}
		if opts.Progress != nil {
			opts.Progress(visited)
		}
		if n < opts.Batch {
			return visited, rewritten, nil
		}
		if err := ctx.Err(); err != nil {
			return visited, rewritten, fmt.Errorf("outbox: rewrite payloads: stopped after %d events: %w", visited, err)
		}
	}
}

// ScanPayloads reads the events m selects, in id order, batch per
// statement, and calls fn for each (`console pii check`).
func ScanPayloads(ctx context.Context, q db.Querier, m PayloadMatch, batch int, fn func(PayloadRow) error) (int64, error) {
	if m.Any == "" {
		return 0, fmt.Errorf("outbox: scan payloads: the match needs Any")
	}
	if batch <= 0 {
		batch = 500
	}
	var seen int64
	after := uuid.Nil
	for {
		rows, err := q.Query(ctx, `SELECT id, event_type, payload FROM outbox_event
			WHERE id > $3 AND `+payloadMatch+` ORDER BY id LIMIT $4`, m.Any, m.Current, after, batch)
		if err != nil {
			return seen, fmt.Errorf("outbox: scan payloads: %w", err)
		}
		page, err := pgx.CollectRows(rows, pgx.RowToStructByPos[PayloadRow])
		if err != nil {
			return seen, fmt.Errorf("outbox: scan payloads: %w", err)
		}
		for _, r := range page {
			after = r.ID
			seen++
			if err := fn(r); err != nil {
				return seen, fmt.Errorf("outbox: scan payloads: event %s: %w", r.ID, err)
			}
		}
		if len(page) < batch {
			return seen, nil
		}
	}
}
