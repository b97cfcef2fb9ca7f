// Package outboxtest makes outbox rows for other rooms' tests (the console,
// the live snapshot, the subcommands), so no test outside internal/outbox
// writes SQL against outbox_event: when the table changes, this file does.
package outboxtest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
)

// Seed describes n similar events, written in one statement. In Topic and
// AggregateID, "{n}" stands for the row's number (1…N).
type Seed struct {
	ID            uuid.UUID // the one event's id (N must be 1); default a time-ordered one
	N             int       // default 1
	Topic         string    // default "test.topic"
	AggregateType string    // default "test"
	AggregateID   string    // default "<seed>-{n}": one aggregate per event, new for every Insert
	AggregateSeq  int64     // default 1
	EventType     string    // default "test.happened.v1"
	Payload       string    // JSON; default {}
	Headers       string    // JSON object; default {}
	Status        string    // pending (default), published, dead or discarded
	Age           time.Duration
	// Attempts and LastError, as a relay would have left them.
	Attempts  int
	LastError string
	InFlight  bool // pending under a relay's live lease (a minute from now)
}

var seeds atomic.Int64

// Insert writes the events and returns their ids in row order. Ids are
// time-ordered like the UUIDv7 ids outbox.Insert makes (the claim and the
// lists order by id, so rows are a millisecond apart, the last one Age in
// the past), and published, dead or discarded times are the created time.
func Insert(t testing.TB, q db.Querier, s Seed) []uuid.UUID {
	t.Helper()
	if s.N <= 0 {
		s.N = 1
	}
	var id *uuid.UUID
	if s.ID != uuid.Nil {
		if s.N != 1 {
			t.Fatalf("outboxtest: an ID names one event, not %d", s.N)
		}
		id = &s.ID
	}
	if s.AggregateSeq <= 0 {
		s.AggregateSeq = 1
	}
	def := func(v *string, d string) {
		if *v == "" {
			*v = d
		}
	}
	def(&s.Topic, "test.topic")
	def(&s.AggregateType, "test")
	def(&s.AggregateID, fmt.Sprintf("seed%d-{n}", seeds.Add(1)))
	def(&s.EventType, "test.happened.v1")
	def(&s.Payload, "{}")
	def(&s.Headers, "{}")
	def(&s.Status, "pending")
	rows, err := q.Query(context.Background(), `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, headers,
		                          status, created_at, available_at, published_at, dead_at, dead_reason,
		                          discarded_at, discard_reason, attempts, last_error, locked_until, lock_token)
		SELECT coalesce(@id::uuid, (lpad(to_hex((extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7' ||
		        substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 4, 15))::uuid),
		       @agg_type, replace(@agg_id, '{n}', g::text), @seq, replace(@topic, '{n}', g::text), @type,
		       @payload::jsonb, @headers::jsonb,
		       @status, at, at,
		       CASE WHEN @status = 'published' THEN at END,
		       CASE WHEN @status IN ('dead', 'discarded') THEN at END,
		       CASE WHEN @status IN ('dead', 'discarded') THEN 'outboxtest' END,
		       CASE WHEN @status = 'discarded' THEN at END,
		       CASE WHEN @status = 'discarded' THEN 'outboxtest' END,
		       @attempts, nullif(@last_error, ''),
		       CASE WHEN @in_flight THEN now() + interval '1 minute' END,
		       CASE WHEN @in_flight THEN gen_random_uuid() END
		  FROM generate_series(1, @n) g,
		       LATERAL (SELECT now() - @age::interval - (@n - g) * interval '1 millisecond' AS at) t
		RETURNING id`,
		pgx.NamedArgs{"id": id, "n": s.N, "topic": s.Topic, "agg_type": s.AggregateType, "agg_id": s.AggregateID, "seq": s.AggregateSeq,
			"type": s.EventType, "payload": s.Payload, "headers": s.Headers, "status": s.Status, "age": s.Age,
			"attempts": s.Attempts, "last_error": s.LastError, "in_flight": s.InFlight})
	if err != nil {
		t.Fatalf("outboxtest: insert %d %s events: %v", s.N, s.Status, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatalf("outboxtest: insert %d %s events: %v", s.N, s.Status, err)
	}
	return ids
}
