package outbox

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/db"
)

// Held is the work a dead letter holds back. With ordering on (the default)
// a dead event holds the later events of its aggregate until an operator
// retries or discards it; this says how much is waiting on operators.
type Held struct {
	Events     int64 `json:"events"`     // pending events behind a dead event of their aggregate
	Aggregates int64 `json:"aggregates"` // aggregates with at least one such event
}

// HeldRead reads Held as a db.Read part. It costs O(dead) probes: the first
// dead event of each aggregate (outbox_event_dead_aggregate_idx, migration
// 00023: the dead rows only, in aggregate order, so nothing is sorted), then
// one range of outbox_event_pending_aggregate_idx (pending and dead rows) per
// such aggregate, counting the pending events after it; never O(history). The
// numbers mean what they say with ordering on; with RELAY_ORDERING=false
// nothing is held and they only say what would be.
type HeldRead struct{ Held Held }

// Expr implements db.Read.
func (r *HeldRead) Expr(*db.Args) string {
	return `SELECT json_build_object('events', coalesce(sum(h.n), 0), 'aggregates', count(*) FILTER (WHERE h.n > 0))
	  FROM (SELECT DISTINCT ON (aggregate_type, aggregate_id) aggregate_type, aggregate_id, aggregate_seq
	          FROM outbox_event WHERE status = 'dead'
	         ORDER BY aggregate_type, aggregate_id, aggregate_seq) d
	 CROSS JOIN LATERAL (
	        SELECT count(*) AS n FROM outbox_event p
	         WHERE p.status = 'pending'
	           AND p.aggregate_type = d.aggregate_type AND p.aggregate_id = d.aggregate_id
	           AND p.aggregate_seq > d.aggregate_seq) h`
}

// Scan implements db.Read.
func (r *HeldRead) Scan(src []byte) error {
	r.Held = Held{}
	if err := db.ScanJSON(src, &r.Held); err != nil {
		return fmt.Errorf("outbox: held behind dead letters: %w", err)
	}
	return nil
}

// ReadHeld reads Held on its own.
func ReadHeld(ctx context.Context, q db.RowQuerier) (Held, error) {
	var r HeldRead
	if _, err := db.ReadAll(ctx, q, &r); err != nil {
		return Held{}, fmt.Errorf("outbox: held behind dead letters: %w", err)
	}
	return r.Held, nil
}

// Ref names another event of the same aggregate.
type Ref struct {
	ID     uuid.UUID
	Seq    int64
	Status string
}

// Hold is where one event stands in its aggregate's order (Detail).
type Hold struct {
	// HeldBy is the earliest unfinished (pending or dead) event of the
	// aggregate before this one: what must be published (or discarded)
	// first. A dead HeldBy is a poison message an operator must act on;
	// a pending one is ordinary waiting. Nil when nothing holds the event,
	// or when the event itself is finished (published, discarded).
	HeldBy *Ref
	// Holds counts the aggregate's later unfinished events, which wait for
	// this one (0 when this event is finished).
	Holds int64
}
