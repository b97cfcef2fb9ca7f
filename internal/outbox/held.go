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
	// Partial: the counts are lower bounds. Counting stopped at
	// HeldAggregatesCounted dead aggregates, or at an aggregate's share of
	// HeldEventsCounted events; the list's held filter shows them all.
	Partial bool `json:"partial"`
}

// What one held read counts at most, so that its cost is bounded whatever an
// incident dead-letters: the dashboard reads it every tick, and unbounded it
// cost one probe per dead aggregate and one index entry per held event (600
// ms per tick at 100,000 dead aggregates, bench/README "The held count,
// bounded"). Below both limits the counts are exact.
const (
	// HeldAggregatesCounted is how many dead aggregates are looked at, in
	// aggregate order. Each costs a probe of 5–9 µs whatever the index's
	// buffers (bench D1 at 10M rows: 1,000 probes were 9 of the snapshot's
	// 12 ms, with or without the heap visits), so this number, not the
	// outbox's size, sets the snapshot's time in an incident: 250 keeps it
	// near 2 ms, and an operator facing 250 poisoned aggregates learns
	// the scale from "250+" and the exact figures from the list.
	HeldAggregatesCounted = 250
	// HeldEventsCounted is how many held events are counted in all, shared
	// evenly by the aggregates looked at (at least 10 each); the list pages
	// count exactly up to the same number (CountExactBelow).
	HeldEventsCounted = CountExactBelow
)

// HeldRead reads Held as a db.Read part. It costs at most
// HeldAggregatesCounted+1 entries of outbox_event_dead_aggregate_idx
// (migration 00023: the dead rows only, in aggregate order, so nothing is
// sorted and the walk stops early), one range of
// outbox_event_pending_aggregate_idx (pending and dead rows) per dead
// aggregate it looks at, and HeldEventsCounted entries in those ranges;
// never O(history) nor O(dead letters). The numbers mean what they say with
// ordering on; with RELAY_ORDERING=false nothing is held and they only say
// what would be.
type HeldRead struct {
	Held Held
	// Lower limits than HeldAggregatesCounted and HeldEventsCounted, for
	// tests; zero: those.
	aggregates, events int
}

// Expr implements db.Read. The limits are literals (db.Int): the snapshot
// runs on a generic plan, which must see them (ReadAllGeneric).
func (r *HeldRead) Expr(*db.Args) string {
	aggs, events := HeldAggregatesCounted, HeldEventsCounted
	if r.aggregates > 0 {
		aggs = r.aggregates
	}
	if r.events > 0 {
		events = r.events
	}
	// d: the first dead event of each of the first aggs+1 dead aggregates
	// (the one past aggs only says there are more); per: each one's share of
	// the events counted; h: the pending events after it, one more than the
	// share (to know that the share was exceeded).
	return `SELECT json_build_object('events', coalesce(sum(least(h.n, d.per)), 0),
	                        'aggregates', count(*) FILTER (WHERE h.n > 0),
	                        'partial', coalesce(bool_or(d.more OR h.n > d.per), false))
	  FROM (SELECT f.aggregate_type, f.aggregate_id, f.aggregate_seq,
	               count(*) OVER () > ` + db.Int(aggs) + ` AS more,
	               greatest(` + db.Int(events) + ` / least(count(*) OVER (), ` + db.Int(aggs) + `), 1) AS per,
	               row_number() OVER () AS i
	          FROM (SELECT DISTINCT ON (aggregate_type, aggregate_id) aggregate_type, aggregate_id, aggregate_seq
	                  FROM outbox_event WHERE status = 'dead'
	                 ORDER BY aggregate_type, aggregate_id, aggregate_seq
	                 LIMIT ` + db.Int(aggs+1) + `) f) d
	 CROSS JOIN LATERAL (
	        SELECT count(*) AS n FROM (
	               SELECT FROM outbox_event p
	                WHERE p.status = 'pending'
	                  AND p.aggregate_type = d.aggregate_type AND p.aggregate_id = d.aggregate_id
	                  AND p.aggregate_seq > d.aggregate_seq
	                LIMIT d.per + 1) c) h
	 WHERE d.i <= ` + db.Int(aggs)
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
