package outbox

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sluice-dev/sluice/internal/db"
)

// The outbox's numbers, each with one definition that the dashboard,
// /metrics, the demo's status line and the list pages share. They are
// db.Read parts: read alone (ReadBacklog) or composed with other rooms' parts
// into the console's one snapshot statement per tick.

// TopicBacklog is the unfinished work of one topic.
type TopicBacklog struct {
	Topic    string `json:"topic"`
	Pending  int64  `json:"pending"`   // status pending, in flight included
	InFlight int64  `json:"in_flight"` // of those, under a live lease among the first BacklogHead in claim order
}

// BacklogHead is how many of a topic's pending events, in claim order, the
// backlog reads for InFlight and OldestPendingAge.
const BacklogHead = 1000

// Backlog is the state of the outbox's unfinished work.
//
// Pending counts every event whose status is pending: waiting, backing off
// or in flight (a relay holds it under a live lease). It is exact, read from
// the backlog counts (outbox_backlog_count, kept on every write), not by
// counting events. This is what sluice_outbox_backlog{topic} reports and what
// the dashboard calls the backlog. Dead is exact the same way.
//
// InFlight is, per topic, the pending events under a live lease among the
// topic's first BacklogHead (1,000) pending events in claim order (id
// order). Relays lease in claim order, so in-flight events are at the head:
// the figure is exact unless a topic has more than 1,000 pending events
// ahead of a leased one (ordering holds back later events of an aggregate,
// a relay passes over them), and then it is a lower bound. Reading the head
// only keeps the read O(topics), whatever the backlog.
//
// OldestPendingAge is now() − the oldest created_at among each topic's first
// BacklogHead pending events in claim order, the oldest over the topics.
// Ids are UUIDv7 made by Insert (the inserting process's clock) and
// created_at is the inserting transaction's start (now()), so claim order
// is creation order up to the length of a transaction and the clock skew
// between producers; the head covers that.
type Backlog struct {
	Topics           []TopicBacklog `json:"topics"` // largest first
	Pending          int64          `json:"pending"`
	InFlight         int64          `json:"in_flight"`
	OldestPendingAge time.Duration  `json:"-"`      // see Backlog
	Dead             int64          `json:"dead"`   // dead letters waiting for an operator
	Paused           []TopicPause   `json:"paused"` // paused topics by name (outbox_topic_pause: a handful of rows)
}

// BacklogRead reads Backlog: the counts from outbox_backlog_count (a few
// rows per topic once compacted, see CompactBacklogCounts), and, for each
// topic with pending events, its first BacklogHead pending events in claim
// order through outbox_event_pending_topic_idx (the read repeats that
// partial index's predicate, a non-empty topic, so the planner may use it;
// every topic is 1 to 200 characters). O(topics × 1,000) at most, never O(backlog) nor O(history).
// Lease liveness is judged on the database clock, now().
//
// The head is "topic = ANY (ARRAY[t]) ORDER BY topic, id", not "topic = t
// ORDER BY id": the same rows, but a plain equality makes the topic a
// constant of the query, and the planner may then walk
// outbox_event_pending_idx in id order filtering by topic (it prices the
// topic index's heap visits as random, topics interleaving), which reads
// every pending event ahead of the topic's first: all of a paused topic's
// backlog, say. "= ANY" is still an index condition on the topic but no
// such constant, so only the (topic, id) index gives the requested order,
// and its estimate stays that of an equality (a range would be priced as
// a few rows and read through a bitmap, all of the topic, then sorted).
// internal/outbox/backlog_plan_internal_test.go keeps it so.
type BacklogRead struct{ Backlog Backlog }

// Expr implements db.Read.
func (r *BacklogRead) Expr(*db.Args) string {
	return `SELECT json_build_object(
	    'topics', coalesce(json_agg(json_build_object('topic', p.topic, 'pending', p.n, 'in_flight', h.in_flight)
	                                ORDER BY p.n DESC, p.topic), '[]'),
	    'pending', coalesce(sum(p.n), 0),
	    'in_flight', coalesce(sum(h.in_flight), 0),
	    'oldest_secs', coalesce(extract(epoch FROM now() - min(h.oldest)), 0),
	    'dead', (SELECT coalesce(sum(n), 0) FROM outbox_backlog_count WHERE status = 'dead'),
	    'paused', (SELECT coalesce(json_agg(json_build_object('topic', topic, 'paused_by', paused_by,
	                                         'paused_at', paused_at, 'reason', reason) ORDER BY topic), '[]')
	                 FROM outbox_topic_pause))
	  FROM (SELECT topic, sum(n) AS n FROM outbox_backlog_count WHERE status = 'pending'
	         GROUP BY topic HAVING sum(n) > 0) p
	 CROSS JOIN LATERAL (
	        SELECT count(*) FILTER (WHERE head.locked_until > now()) AS in_flight, min(head.created_at) AS oldest
	          FROM (SELECT e.locked_until, e.created_at FROM outbox_event e
	                 WHERE e.status = 'pending' AND e.topic > '' AND e.topic = ANY (ARRAY[p.topic])
	                 ORDER BY e.topic, e.id LIMIT ` + strconv.Itoa(BacklogHead) + `) head) h`
}

// Scan implements db.Read.
func (r *BacklogRead) Scan(src []byte) error {
	var w struct {
		Backlog
		OldestSecs float64 `json:"oldest_secs"`
	}
	if err := db.ScanJSON(src, &w); err != nil {
		return fmt.Errorf("outbox: backlog: %w", err)
	}
	r.Backlog = w.Backlog
	r.Backlog.OldestPendingAge = time.Duration(max(w.OldestSecs, 0) * float64(time.Second))
	return nil
}

// ReadBacklog reads the backlog on its own.
func ReadBacklog(ctx context.Context, q db.RowQuerier) (Backlog, error) {
	var r BacklogRead
	if _, err := db.ReadAll(ctx, q, &r); err != nil {
		return Backlog{}, fmt.Errorf("outbox: backlog: %w", err)
	}
	return r.Backlog, nil
}

// PublishedSinceRead counts events published after Since (the previous
// snapshot's time), through the published partial index: O(published since).
type PublishedSinceRead struct {
	Since time.Time
	Count int64
}

// Expr implements db.Read.
func (r *PublishedSinceRead) Expr(args *db.Args) string {
	return `SELECT count(*) FROM outbox_event WHERE status = 'published' AND published_at > ` + args.Add(r.Since)
}

// Scan implements db.Read.
func (r *PublishedSinceRead) Scan(src []byte) error {
	return db.ScanJSON(src, &r.Count)
}

// DeadEvent is a recent dead letter (no payload: summaries carry no data).
type DeadEvent struct {
	ID        string    `json:"id"`
	Topic     string    `json:"topic"`
	EventType string    `json:"event_type"`
	Attempts  int       `json:"attempts"`
	DeadAt    time.Time `json:"dead_at"`
	// LastError is the start of the last publish error (its first 160
	// characters), so support sees why an event died without opening it.
	// It is attacker-reachable text: views escape it like everything else.
	LastError string `json:"last_error"`
}

// RecentDeadRead lists the Limit newest dead letters (dead partial index).
type RecentDeadRead struct {
	Limit  int
	Events []DeadEvent
}

// Expr implements db.Read.
func (r *RecentDeadRead) Expr(args *db.Args) string {
	return `SELECT coalesce(json_agg(json_build_object('id', id, 'topic', topic, 'event_type', event_type,
	                                 'attempts', attempts, 'dead_at', dead_at,
	                                 'last_error', left(coalesce(last_error, dead_reason, ''), 160))
	                                 ORDER BY dead_at DESC, id), '[]')
	  FROM (SELECT id, topic, event_type, attempts, dead_at, last_error, dead_reason FROM outbox_event
	         WHERE status = 'dead' ORDER BY dead_at DESC, id LIMIT ` + args.Add(r.Limit) + `) d`
}

// Scan implements db.Read.
func (r *RecentDeadRead) Scan(src []byte) error {
	r.Events = nil
	if err := db.ScanJSON(src, &r.Events); err != nil {
		return fmt.Errorf("outbox: recent dead letters: %w", err)
	}
	return nil
}
