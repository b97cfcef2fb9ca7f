package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/testkit"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// newClock is an injected relay clock that starts just after the database's
// now(), so rows inserted before are already available.
func newClock() *testkit.Clock {
	return testkit.NewClock(time.Now().Add(time.Millisecond))
}

// published is one message a memPublisher accepted.
type published struct {
	By  string
	Msg broker.Message
}

// memPublisher is an in-memory broker for these unit tests only: it records
// every accepted message in acceptance order (a stand-in for a subscriber
// reading one stream) and can fail or intercept chosen messages.
type memPublisher struct {
	name string
	log  *pubLog
	// before runs first; a non-nil error fails the publish.
	before func(ctx context.Context, msg broker.Message) error
	// after runs once the message is recorded.
	after func(msg broker.Message)
}

type pubLog struct {
	mu  sync.Mutex
	got []published
}

func (l *pubLog) all() []published {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]published(nil), l.got...)
}

func (p *memPublisher) Publish(ctx context.Context, msg broker.Message) error {
	if p.before != nil {
		if err := p.before(ctx, msg); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	p.log.mu.Lock()
	p.log.got = append(p.log.got, published{By: p.name, Msg: msg})
	p.log.mu.Unlock()
	if p.after != nil {
		p.after(msg)
	}
	return nil
}

// PublishBatch makes memPublisher a broker.BatchPublisher, as JetStream is:
// every message of the batch in flight at once, one outcome each. The relay
// publishes through it in waves, so most relay tests run that path;
// onePublisher hides it to test the one-at-a-time path.
func (p *memPublisher) PublishBatch(ctx context.Context, msgs []broker.Message) []error {
	errs := make([]error, len(msgs))
	var wg sync.WaitGroup
	for i, m := range msgs {
		wg.Go(func() { errs[i] = p.Publish(ctx, m) })
	}
	wg.Wait()
	return errs
}

// onePublisher is a publisher without PublishBatch (RabbitMQ's kind): the
// relay publishes its events one at a time, several aggregates at once.
type onePublisher struct{ p *memPublisher }

func (o onePublisher) Publish(ctx context.Context, msg broker.Message) error {
	return o.p.Publish(ctx, msg)
}

// seeded is one event bulkInsert wrote.
type seeded struct {
	ID  uuid.UUID
	Agg string
	Seq int64
}

// bulkInsert writes aggregates×perAggregate pending events with COPY (the
// relay tests need volume, not Insert's per-row path, which has its own
// tests). Ids are UUIDv7 made seq-major, so id order is creation order.
func bulkInsert(t *testing.T, pool *pgxpool.Pool, prefix string, aggregates, perAggregate int) []seeded {
	t.Helper()
	var (
		out  []seeded
		rows [][]any
	)
	for seq := 1; seq <= perAggregate; seq++ {
		for a := 0; a < aggregates; a++ {
			id, err := uuid.NewV7()
			if err != nil {
				t.Fatal(err)
			}
			agg := fmt.Sprintf("%s-%d", prefix, a)
			out = append(out, seeded{ID: id, Agg: agg, Seq: int64(seq)})
			rows = append(rows, []any{id, "test", agg, int64(seq), "test.topic", "test.happened.v1", []byte(`{"n":1}`)})
		}
	}
	_, err := pool.CopyFrom(context.Background(), pgx.Identifier{"outbox_event"},
		[]string{"id", "aggregate_type", "aggregate_id", "aggregate_seq", "topic", "event_type", "payload"},
		pgx.CopyFromRows(rows))
	if err != nil {
		t.Fatalf("bulk insert: %v", err)
	}
	return out
}

func statusCounts(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT status, count(*) FROM outbox_event GROUP BY status`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		out[s] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
