package inbox_test

import (
	"context"
	"testing"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/inbox"
)

// The consumer as the broker drives it: redeliveries are absorbed, an old
// event arriving after a newer one of its aggregate is dropped as stale, and
// the reference effect holds one row per applied event.
func TestConsumerAbsorbsRedeliveriesAndStaleEvents(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	c := &inbox.Consumer{Inbox: inbox.New(pool), Name: "ref"}
	msg := func(id string, seq int64) broker.Message {
		return broker.Message{ID: id, Topic: "t", AggregateType: "invoice", AggregateID: "i1", AggregateSeq: seq, EventType: "invoice.v1", Payload: []byte(`{}`)}
	}
	for _, m := range []broker.Message{msg("a", 1), msg("a", 1), msg("c", 3), msg("b", 2), msg("c", 3), msg("d", 4)} {
		if err := c.Handle(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.Counts(); got != (inbox.ConsumerCounts{Applied: 3, Duplicates: 2, Stale: 1}) {
		t.Fatalf("counts %+v, want 3 applied, 2 duplicates, 1 stale", got)
	}
	for id, want := range map[string]int{"a": 1, "b": 0, "c": 1, "d": 1} {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM consume_effect WHERE consumer = 'ref' AND event_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Fatalf("effect rows of %s = %d, want %d", id, n, want)
		}
	}
	// A message without an aggregate sequence is deduplicated only.
	plain := broker.Message{ID: "p", Topic: "t", EventType: "x.v1", Payload: []byte(`{}`)}
	for range 2 {
		if err := c.Handle(ctx, plain); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.Counts(); got.Applied != 4 || got.Duplicates != 3 {
		t.Fatalf("counts %+v after a plain message twice", got)
	}
}
