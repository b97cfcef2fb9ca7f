package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
)

// ErrNotFound reports an outbox event that does not exist (any more).
var ErrNotFound = errors.New("outbox: event not found")

// Row is an outbox event as stored, for the console.
type Row struct {
	ID            uuid.UUID
	AggregateType string
	AggregateID   string
	AggregateSeq  int64
	Topic         string
	EventType     string
	Payload       json.RawMessage
	Headers       json.RawMessage
	Status        string
	CreatedAt     time.Time
	AvailableAt   time.Time
	LockedUntil   *time.Time
	Attempts      int
	LastError     *string
	PublishedAt   *time.Time
	DeadAt        *time.Time
	DeadReason    *string
}

// InFlight reports whether a relay holds the event under a live lease at now.
func (r Row) InFlight(now time.Time) bool {
	return r.Status == StatusPending && r.LockedUntil != nil && r.LockedUntil.After(now)
}

// Get reads one event.
func Get(ctx context.Context, q db.Querier, id uuid.UUID) (Row, error) {
	var r Row
	err := q.QueryRow(ctx, `
		SELECT id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, headers, status,
		       created_at, available_at, locked_until, attempts, last_error, published_at, dead_at, dead_reason
		  FROM outbox_event WHERE id = $1`, id).Scan(
		&r.ID, &r.AggregateType, &r.AggregateID, &r.AggregateSeq, &r.Topic, &r.EventType, &r.Payload, &r.Headers, &r.Status,
		&r.CreatedAt, &r.AvailableAt, &r.LockedUntil, &r.Attempts, &r.LastError, &r.PublishedAt, &r.DeadAt, &r.DeadReason)
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, ErrNotFound
	}
	if err != nil {
		return Row{}, fmt.Errorf("outbox: get %s: %w", id, err)
	}
	return r, nil
}

// Retry makes events publishable now: a dead event becomes pending again, a
// pending one (e.g. backing off) loses its wait. It is compare-and-set on the
// current state: an event that is published, in flight under a live relay
// lease, or missing is left alone and absent from changed. Attempts restart
// at 0 so the event gets its full allowance again; last_error is kept as
// history until the next attempt overwrites it.
func Retry(ctx context.Context, q db.Querier, ids []uuid.UUID) (changed []uuid.UUID, err error) {
	return collectIDs(q.Query(ctx, `
		UPDATE outbox_event
		   SET status = 'pending', available_at = clock_timestamp(), attempts = 0,
		       locked_until = NULL, lock_token = NULL, dead_at = NULL, dead_reason = NULL
		 WHERE id = ANY($1)
		   AND (status = 'dead'
		        OR (status = 'pending' AND (locked_until IS NULL OR locked_until < clock_timestamp())))
		RETURNING id`, ids))
}

// DeadLetter moves pending events to dead with reason, so no relay publishes
// them until an operator retries. Compare-and-set: only pending events that
// no relay holds under a live lease change (an in-flight event may already be
// at the broker); the others are absent from changed.
func DeadLetter(ctx context.Context, q db.Querier, ids []uuid.UUID, reason string) (changed []uuid.UUID, err error) {
	if reason == "" {
		return nil, errors.New("outbox: dead-letter needs a reason")
	}
	return collectIDs(q.Query(ctx, `
		UPDATE outbox_event
		   SET status = 'dead', dead_at = clock_timestamp(), dead_reason = $2,
		       locked_until = NULL, lock_token = NULL
		 WHERE id = ANY($1)
		   AND status = 'pending' AND (locked_until IS NULL OR locked_until < clock_timestamp())
		RETURNING id`, ids, reason))
}

// Unchanged lists the ids of asked that are not in changed (in asked order).
func Unchanged(asked, changed []uuid.UUID) []uuid.UUID {
	done := make(map[uuid.UUID]bool, len(changed))
	for _, id := range changed {
		done[id] = true
	}
	var out []uuid.UUID
	for _, id := range asked {
		if !done[id] {
			out = append(out, id)
		}
	}
	return out
}

func collectIDs(rows pgx.Rows, err error) ([]uuid.UUID, error) {
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return ids, nil
}

// Prune deletes published events whose published_at is older than
// now-retention, at most batch rows per statement (db.MaxDeleteBatch at
// most), until none are left. It never touches pending or dead events. It
// returns how many rows it deleted.
func Prune(ctx context.Context, q db.Querier, retention time.Duration, batch int, now time.Time) (int64, error) {
	if retention < 0 {
		return 0, fmt.Errorf("outbox: retention must not be negative (got %s)", retention)
	}
	// Oldest first along outbox_event_published_idx; the outer status check
	// is belt and braces (published is terminal).
	return db.DeleteInBatches(ctx, q, "outbox: prune", `
		DELETE FROM outbox_event
		 WHERE id IN (SELECT id FROM outbox_event
		               WHERE status = 'published' AND published_at < $1
		               ORDER BY published_at
		               LIMIT $2)
		   AND status = 'published'`, now.Add(-retention), batch)
}
