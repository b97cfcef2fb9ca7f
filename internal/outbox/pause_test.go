package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// copyEvents writes pending events with COPY: for each aggregate, one event
// per topic in topics, with sequence numbers 1, 2, ... in that order.
func copyEvents(t *testing.T, pool *pgxpool.Pool, prefix string, aggregates int, topics ...string) []seeded {
	t.Helper()
	var (
		out  []seeded
		rows [][]any
	)
	for seq, topic := range topics {
		for a := range aggregates {
			id, err := uuid.NewV7()
			if err != nil {
				t.Fatal(err)
			}
			agg := fmt.Sprintf("%s-%d", prefix, a)
			out = append(out, seeded{ID: id, Agg: agg, Seq: int64(seq + 1)})
			rows = append(rows, []any{id, "test", agg, int64(seq + 1), topic, "test.happened.v1", []byte(`{}`)})
		}
	}
	_, err := pool.CopyFrom(context.Background(), pgx.Identifier{"outbox_event"},
		[]string{"id", "aggregate_type", "aggregate_id", "aggregate_seq", "topic", "event_type", "payload"},
		pgx.CopyFromRows(rows))
	if err != nil {
		t.Fatalf("copy events: %v", err)
	}
	return out
}

// A paused topic publishes nothing for ten seconds while events of another
// topic keep being written and published; its aggregates' later events in
// the running topic are held behind it (order per aggregate); relays
// restarted while it is paused still skip it; after a resume its whole
// backlog is published, in order per aggregate.
func TestPausedTopicPublishesNothingUnderLoadAndResumesInOrder(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()

	if _, err := outbox.PauseTopic(ctx, pool, "paused", "test operator", "consumer is being migrated"); err != nil {
		t.Fatal(err)
	}
	// A paused backlog at the head of the pending index: 300 aggregates
	// with three paused events each, and 100 aggregates whose first event
	// is paused and second runs (it must wait for the first).
	backlog := copyEvents(t, pool, "p", 300, "paused", "paused", "paused")
	mixed := copyEvents(t, pool, "mix", 100, "paused", "running")

	log := &pubLog{}
	start := func(ctx context.Context, name string) *sync.WaitGroup {
		var wg sync.WaitGroup
		for i := range 2 {
			n := fmt.Sprintf("%s-%d", name, i)
			r, err := outbox.NewRelay(pool, &memPublisher{name: n, log: log},
				outbox.RelayConfig{Name: n, BatchSize: 50, PollInterval: 10 * time.Millisecond}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() { _ = r.Run(ctx) })
		}
		return &wg
	}
	// The load: events of the running topic written one transaction each,
	// as a service writes them, until stopped.
	var written atomic.Int64
	load := func(ctx context.Context, prefix string) *sync.WaitGroup {
		var wg sync.WaitGroup
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
					_, err := outbox.Insert(ctx, tx, outbox.Event{AggregateType: "load", AggregateID: fmt.Sprintf("%s-%d", prefix, i%50),
						Topic: "running", EventType: "load.v1", Payload: []byte(`{}`)})
					return err
				})
				if err != nil && ctx.Err() == nil {
					t.Errorf("load insert: %v", err)
					return
				}
				if err == nil {
					written.Add(1)
				}
			}
		})
		return &wg
	}
	publishedOf := func(topic string) (n int) {
		for _, p := range log.all() {
			if p.Msg.Topic == topic {
				n++
			}
		}
		return n
	}

	rctx, stopRelays := context.WithCancel(ctx)
	relays := start(rctx, "first")
	lctx, stopLoad := context.WithCancel(ctx)
	loading := load(lctx, "a")
	time.Sleep(10 * time.Second) // the pause must hold for a while under load, not only at one instant
	stopLoad()
	loading.Wait()
	testkit.Until(t, "the load published", func() bool { return publishedOf("running") >= int(written.Load()) })
	if n := publishedOf("paused"); n != 0 {
		t.Fatalf("%d events of the paused topic published", n)
	}
	if written.Load() == 0 {
		t.Fatal("the load wrote nothing: the test proves nothing")
	}
	// The mixed aggregates' second events are in the running topic, but
	// their first events are paused: none of them may have gone out.
	for _, p := range log.all() {
		if p.Msg.AggregateType == "test" {
			t.Fatalf("event %s/%s seq %d published ahead of its aggregate's paused earlier event", p.Msg.AggregateID, p.Msg.Topic, p.Msg.AggregateSeq)
		}
	}

	// Relays restarted while the topic is paused still skip it.
	stopRelays()
	relays.Wait()
	rctx, stopRelays = context.WithCancel(ctx)
	defer stopRelays()
	relays = start(rctx, "second")
	before := written.Load()
	lctx, stopLoad = context.WithCancel(ctx)
	loading = load(lctx, "b")
	testkit.Until(t, "the restarted relays publish new load", func() bool { return written.Load() > before+100 })
	stopLoad()
	loading.Wait()
	testkit.Until(t, "the second load published", func() bool { return publishedOf("running") >= int(written.Load()) })
	if n := publishedOf("paused"); n != 0 {
		t.Fatalf("restarted relays published %d events of the paused topic", n)
	}

	p, err := outbox.ResumeTopic(ctx, pool, "paused")
	if err != nil {
		t.Fatal(err)
	}
	if p.PausedBy != "test operator" || p.Reason != "consumer is being migrated" {
		t.Fatalf("resume returned the pause %+v", p)
	}
	var want int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event`).Scan(&want); err != nil {
		t.Fatal(err)
	}
	if min := len(backlog) + len(mixed) + int(written.Load()); want < min {
		t.Fatalf("%d events in the outbox, want at least %d", want, min)
	}
	testkit.Until(t, "the paused backlog published after resume", func() bool { return len(log.all()) >= want })
	stopRelays()
	relays.Wait()
	got := log.all()
	if len(got) != want {
		t.Fatalf("published %d messages, want %d (no crash: no duplicates)", len(got), want)
	}
	assertOrderPerAggregate(t, got)
	if n := statusCounts(t, pool)[outbox.StatusPending]; n != 0 {
		t.Fatalf("%d events still pending", n)
	}
}

// Pause and resume are compare-and-set: pausing a paused topic and resuming
// a running one are conflicts that change nothing; a reason and an actor are
// required.
func TestPauseAndResumeAreCompareAndSet(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	if _, err := outbox.PauseTopic(ctx, pool, "t", "ann", ""); !errors.Is(err, outbox.ErrInvalidAction) {
		t.Fatalf("pause without reason: %v", err)
	}
	if _, err := outbox.PauseTopic(ctx, pool, "", "ann", "why"); !errors.Is(err, outbox.ErrInvalidAction) {
		t.Fatalf("pause of no topic: %v", err)
	}
	var conflict *outbox.TopicConflictError
	if _, err := outbox.ResumeTopic(ctx, pool, "t"); !errors.As(err, &conflict) || conflict.Paused != nil || !errors.Is(err, outbox.ErrConflict) {
		t.Fatalf("resume of a running topic: %v", err)
	}
	if _, err := outbox.PauseTopic(ctx, pool, "t", "ann", "first"); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.PauseTopic(ctx, pool, "t", "bob", "second"); !errors.As(err, &conflict) || conflict.Paused == nil ||
		conflict.Paused.PausedBy != "ann" || conflict.Paused.Reason != "first" {
		t.Fatalf("pause of a paused topic: %v (%+v)", err, conflict)
	}
	ps, err := outbox.PausedTopics(ctx, pool)
	if err != nil || len(ps) != 1 || ps[0].PausedBy != "ann" {
		t.Fatalf("paused topics %+v, %v", ps, err)
	}
	// Five operators resume at once: one succeeds.
	var ok atomic.Int32
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			if _, err := outbox.ResumeTopic(ctx, pool, "t"); err == nil {
				ok.Add(1)
			} else if !errors.Is(err, outbox.ErrConflict) {
				t.Errorf("resume: %v", err)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 1 {
		t.Fatalf("%d resumes succeeded, want 1", ok.Load())
	}
}
