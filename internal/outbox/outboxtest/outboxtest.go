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

	"github.com/sluice-dev/sluice/internal/db"
)

// Seed describes n similar events, written in one statement. In Topic and
// AggregateID, "{n}" stands for the row's number (1…N).
type Seed struct {
	N             int    // default 1
	Topic         string // default "test.topic"
	AggregateType string // default "test"
	AggregateID   string // default "<seed>-{n}": one aggregate per event, new for every Insert
	EventType     string // default "test.happened.v1"
	Status        string // pending (default), published, dead or discarded
	Age           time.Duration
	// Attempts and LastError, as a relay would have left them.
	Attempts  int
	LastError string
	InFlight  bool // pending under a relay's live lease (a minute from now)
}

var seeds atomic.Int64

// Insert writes the events and returns nothing: tests read what they need
// through the outbox's own functions. Ids are time-ordered like the
// UUIDv7 ids outbox.Insert makes (the claim and the lists order by id), and
// created, published, dead or discarded times lie Age in the past.
func Insert(t testing.TB, q db.Querier, s Seed) {
	t.Helper()
	if s.N <= 0 {
		s.N = 1
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
	def(&s.Status, "pending")
	_, err := q.Exec(context.Background(), `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload,
		                          status, created_at, available_at, published_at, dead_at, dead_reason,
		                          discarded_at, discard_reason, attempts, last_error, locked_until, lock_token)
		SELECT (lpad(to_hex((extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7' ||
		        substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 4, 15))::uuid,
		       @agg_type, replace(@agg_id, '{n}', g::text), 1, replace(@topic, '{n}', g::text), @type, '{}'::jsonb,
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
		       LATERAL (SELECT now() - @age::interval + g * interval '1 microsecond' AS at) t`,
		pgxArgs(s))
	if err != nil {
		t.Fatalf("outboxtest: insert %d %s events: %v", s.N, s.Status, err)
	}
}
