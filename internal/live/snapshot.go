// Package live is the console's one feed per process: a poller reads one
// snapshot of the system per tick (woken early by LISTEN/NOTIFY), keeps an
// hour of them in memory for sparklines, and a hub pushes the rendered
// changes to every subscribed browser. Cost is one query per tick per
// process, whatever the number of browsers.
package live

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// TopicBacklog is the pending work of one topic.
type TopicBacklog struct {
	Topic    string `json:"topic"`
	Pending  int64  `json:"pending"`
	InFlight int64  `json:"in_flight"`
}

// DeadEvent is a recent dead letter (no payload: the dashboard shows no data).
type DeadEvent struct {
	ID        string    `json:"id"`
	Topic     string    `json:"topic"`
	EventType string    `json:"event_type"`
	Attempts  int       `json:"attempts"`
	DeadAt    time.Time `json:"dead_at"`
	// LastError is the start of the last publish error, so support sees why
	// an event died without opening it (its first 160 characters). It is attacker-reachable text: views
	// escape it like everything else.
	LastError string `json:"last_error"`
}

// UnknownPayment is a payment whose outcome is not known yet (no customer
// data: the dashboard carries no PII).
type UnknownPayment struct {
	OperationID  string    `json:"operation_id"`
	Amount       string    `json:"amount"`
	Currency     string    `json:"currency"`
	UnknownSince time.Time `json:"unknown_since"`
}

// Snapshot is the state of the system at one instant (the database's clock).
type Snapshot struct {
	At               time.Time
	Backlog          []TopicBacklog
	Pending          int64
	InFlight         int64
	OldestPendingAge time.Duration
	Dead             int64
	Published        int64   // published since the previous snapshot
	PublishedPerSec  float64 // Published over the time since the previous snapshot
	Unknown          int64
	ReconcileAge     time.Duration // age of the oldest unknown payment
	StuckProcessing  int64         // idempotency records in processing whose lease expired
	RecentDead       []DeadEvent
	RecentUnknown    []UnknownPayment
}

// Querier is what the poller reads through (a pool; tests wrap it to count).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// SnapshotSQL is the one statement per tick. Every part reads a partial
// index (pending, dead, unknown, processing, published-since), so its cost
// follows the live work, never the history. $1 is the previous snapshot's
// time: the published count covers only the rows published since.
const SnapshotSQL = `
WITH pending AS (
    SELECT topic,
           count(*) AS pending,
           count(*) FILTER (WHERE locked_until > now()) AS in_flight,
           min(created_at) AS oldest
    FROM outbox_event
    WHERE status = 'pending'
    GROUP BY topic
)
SELECT now(),
       coalesce((SELECT json_agg(json_build_object('topic', topic, 'pending', pending, 'in_flight', in_flight)
                                 ORDER BY pending DESC, topic)
                 FROM pending), '[]'),
       coalesce((SELECT sum(pending) FROM pending), 0)::bigint,
       coalesce((SELECT sum(in_flight) FROM pending), 0)::bigint,
       coalesce((SELECT extract(epoch FROM now() - min(oldest)) FROM pending), 0)::float8,
       (SELECT count(*) FROM outbox_event WHERE status = 'dead'),
       (SELECT count(*) FROM outbox_event WHERE status = 'published' AND published_at > $1),
       (SELECT count(*) FROM payment WHERE status = 'unknown'),
       coalesce((SELECT extract(epoch FROM now() - min(unknown_since)) FROM payment WHERE status = 'unknown'), 0)::float8,
       (SELECT count(*) FROM idempotency_record WHERE status = 'processing' AND locked_until < now()),
       coalesce((SELECT json_agg(json_build_object('id', id, 'topic', topic, 'event_type', event_type,
                                                   'attempts', attempts, 'dead_at', dead_at,
                                                   'last_error', left(coalesce(last_error, dead_reason, ''), 160)) ORDER BY dead_at DESC, id)
                 FROM (SELECT id, topic, event_type, attempts, dead_at, last_error, dead_reason FROM outbox_event
                       WHERE status = 'dead' ORDER BY dead_at DESC, id LIMIT 5) d), '[]'),
       coalesce((SELECT json_agg(json_build_object('operation_id', operation_id, 'amount', amount::text,
                                                   'currency', currency, 'unknown_since', since)
                                 ORDER BY since, operation_id)
                 FROM (SELECT p.operation_id, p.amount, p.currency, coalesce(p.unknown_since, p.updated_at) AS since
                       FROM payment p WHERE p.status = 'unknown'
                       ORDER BY p.unknown_since, p.operation_id LIMIT 5) u), '[]')`

// ReadSnapshot runs SnapshotSQL. since is the previous snapshot's time (zero
// for the first: then the rate covers the last second).
func ReadSnapshot(ctx context.Context, q Querier, prev time.Time) (Snapshot, error) {
	var (
		s                         Snapshot
		backlog, dead, unknown    []byte
		oldestSecs, reconcileSecs float64
	)
	since := prev
	if since.IsZero() {
		since = time.Now().Add(-time.Second)
	}
	err := q.QueryRow(ctx, SnapshotSQL, since).Scan(&s.At, &backlog, &s.Pending, &s.InFlight, &oldestSecs,
		&s.Dead, &s.Published, &s.Unknown, &reconcileSecs, &s.StuckProcessing, &dead, &unknown)
	if err != nil {
		return Snapshot{}, fmt.Errorf("live: snapshot: %w", err)
	}
	if err := json.Unmarshal(backlog, &s.Backlog); err != nil {
		return Snapshot{}, fmt.Errorf("live: snapshot backlog: %w", err)
	}
	if err := json.Unmarshal(dead, &s.RecentDead); err != nil {
		return Snapshot{}, fmt.Errorf("live: snapshot dead letters: %w", err)
	}
	if err := json.Unmarshal(unknown, &s.RecentUnknown); err != nil {
		return Snapshot{}, fmt.Errorf("live: snapshot unknowns: %w", err)
	}
	s.OldestPendingAge = time.Duration(oldestSecs * float64(time.Second))
	s.ReconcileAge = time.Duration(reconcileSecs * float64(time.Second))
	if elapsed := s.At.Sub(since).Seconds(); elapsed > 0 {
		s.PublishedPerSec = float64(s.Published) / elapsed
	}
	return s, nil
}
