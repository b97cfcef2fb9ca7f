package outbox

import (
	"context"
	"fmt"
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
	InFlight int64  `json:"in_flight"` // of those, under a live lease
}

// Backlog is the state of the outbox's unfinished work.
//
// Pending counts every event whose status is pending: waiting, backing off
// or in flight (a relay holds it under a live lease). InFlight is the part of
// Pending under a live lease. This is what sluice_outbox_backlog{topic}
// reports and what the dashboard calls the backlog.
type Backlog struct {
	Topics           []TopicBacklog `json:"topics"` // largest first
	Pending          int64          `json:"pending"`
	InFlight         int64          `json:"in_flight"`
	OldestPendingAge time.Duration  `json:"-"`      // now() − created_at of the oldest pending event
	Dead             int64          `json:"dead"`   // dead letters waiting for an operator
	Paused           []TopicPause   `json:"paused"` // paused topics by name (outbox_topic_pause: a handful of rows)
}

// BacklogRead reads Backlog. Every count reads a partial index (pending,
// dead), so it costs O(unfinished work), never O(history). Lease liveness is
// judged on the database clock, now().
type BacklogRead struct{ Backlog Backlog }

// Expr implements db.Read.
func (r *BacklogRead) Expr(*db.Args) string {
	return `SELECT json_build_object(
	    'topics', coalesce(json_agg(json_build_object('topic', topic, 'pending', pending, 'in_flight', in_flight)
	                                ORDER BY pending DESC, topic), '[]'),
	    'pending', coalesce(sum(pending), 0),
	    'in_flight', coalesce(sum(in_flight), 0),
	    'oldest_secs', coalesce(extract(epoch FROM now() - min(oldest)), 0),
	    'dead', (SELECT count(*) FROM outbox_event WHERE status = 'dead'),
	    'paused', (SELECT coalesce(json_agg(json_build_object('topic', topic, 'paused_by', paused_by,
	                                         'paused_at', paused_at, 'reason', reason) ORDER BY topic), '[]')
	                 FROM outbox_topic_pause))
	  FROM (SELECT topic, count(*) AS pending,
	               count(*) FILTER (WHERE locked_until > now()) AS in_flight,
	               min(created_at) AS oldest
	          FROM outbox_event WHERE status = 'pending'
	         GROUP BY topic) t`
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
