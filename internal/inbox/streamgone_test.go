package inbox_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/natsbroker"
	"github.com/sluice-dev/sluice/internal/broker/natsbroker/natstest"
	"github.com/sluice-dev/sluice/internal/broker/natsembedded"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// The JetStream stream deleted under a running relay (an operator's
// mistake, or a cluster that lost it): the publishes find no stream, which
// is not the events' fault. With one attempt allowed, a single counted
// failure would dead-letter an event; none may be. The relay gives the
// events back and pauses, the publisher creates the stream again, and every
// event committed after the deletion is stored there exactly once, each
// aggregate's in order.
func TestStreamDeletedUnderTheRelayDeadLettersNothing(t *testing.T) {
	t.Parallel()
	g := newOneAttemptRig(t, "gone")
	ctx, pool, b, r, count := g.ctx, g.pool, g.b, g.r, g.count
	const aggregates = 10
	insert := func(from, to int) { t.Helper(); insertOrders(ctx, t, pool, from, to, aggregates) }

	insert(0, 100)
	testkit.UntilCount(t, "the first 100 events published", 100, func() int64 { return count("published") })

	js := natstest.Admin(t, g.url)
	if err := js.DeleteStream(ctx, b.Stream()); err != nil {
		t.Fatalf("delete the stream: %v", err)
	}
	insert(100, 200)
	g.untilPublishedNoneDead("the 100 events committed after the deletion", 200, "the stream was gone")
	var spent int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE attempts > 0 AND status <> 'published'`).Scan(&spent); err != nil || spent != 0 {
		t.Fatalf("%d events left with a spent attempt (%v)", spent, err)
	}
	if s := r.Stats(); s.Failed == 0 {
		// Failed counts the publishes given back too: none means the
		// relay never met the missing stream, and this test proved nothing.
		t.Fatalf("relay stats %+v: no publish met the deleted stream", s)
	}

	// The recreated stream holds the 100 later events, once each, each
	// aggregate's in sequence.
	checkStream(ctx, t, js, b.Stream(), 100, aggregates)
}

// A JetStream that stops acknowledging publishes under a running relay (a
// stalled disk, or a cluster electing a leader during a rolling restart;
// here the stream set to NoAck, which stores without answering): every
// publish times out on a live connection. With one attempt allowed, a
// single counted timeout would dead-letter an event; none may be. The
// relay gives the events back and pauses; once acks come back every event
// is stored exactly once (what was stored unanswered, the stream's
// duplicate window drops when sent again), each aggregate's in order.
func TestJetStreamThatStopsAcknowledgingDeadLettersNothing(t *testing.T) {
	t.Parallel()
	g := newOneAttemptRig(t, "stalled")
	ctx, pool, b, r, count := g.ctx, g.pool, g.b, g.r, g.count
	const aggregates = 10
	js := natstest.Admin(t, g.url)
	setNoAck := func(on bool) {
		t.Helper()
		natstest.TuneStream(t, js, b.Stream(), func(c *jetstream.StreamConfig) { c.NoAck = on })
	}

	insertOrders(ctx, t, pool, 0, 100, aggregates)
	testkit.UntilCount(t, "the first 100 events published", 100, func() int64 { return count("published") })

	setNoAck(true)
	insertOrders(ctx, t, pool, 100, 200, aggregates)
	// Several rounds of the heads timing out: the relay's first pause and
	// at least one probe after it.
	testkit.Until(t, "the relay to meet the stall twice, or an event to be dead-lettered", func() bool {
		return r.Stats().Failed >= 2*aggregates || count("dead") > 0
	})
	setNoAck(false)
	g.untilPublishedNoneDead("the 100 events committed during the stall", 200, "JetStream did not acknowledge")
	checkStream(ctx, t, js, b.Stream(), 200, aggregates)
}

// A sharded consumer whose stream is deleted and created again under it:
// the new stream counts from 1, and a shard reader going on at its last
// sequence + 1 would skip that many of the new stream's messages. Every
// event committed after the deletion must be applied, once, in order, and
// so must those of a consumer process started afresh afterwards, whose
// stored positions belong to the deleted stream.
func TestShardedConsumerAfterTheStreamIsCreatedAgain(t *testing.T) {
	t.Parallel()
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	pool := dbtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	opts := broker.Options{Namespace: "gone-sharded"}
	const shards, aggregates = 4, 40
	b, err := natsbroker.Open(ctx, srv.ClientURL(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	r, err := outbox.NewRelay(pool, b, outbox.RelayConfig{Name: "relay", BatchSize: 50, Shards: shards, PollInterval: 20 * time.Millisecond}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { _ = r.Run(ctx) })
	consume := func(cctx context.Context) {
		sub, err := natsbroker.Open(ctx, srv.ClientURL(), opts)
		if err != nil {
			t.Fatal(err)
		}
		c := &inbox.ShardedConsumer{Inbox: inbox.New(pool), Name: "sharded", Shards: shards, Batch: 20, RetryInterval: 100 * time.Millisecond}
		wg.Go(func() {
			defer sub.Close()
			if err := c.Run(cctx, sub); err != nil && cctx.Err() == nil {
				t.Error(err)
			}
		})
	}
	insert := func(from, to int) { t.Helper(); insertOrders(ctx, t, pool, from, to, aggregates) }
	effects := func() int64 {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM consume_effect`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	js := natstest.Admin(t, srv.ClientURL())
	deleteStream := func() {
		t.Helper()
		if err := js.DeleteStream(ctx, b.Stream()); err != nil {
			t.Fatalf("delete the stream: %v", err)
		}
	}

	first, stopFirst := context.WithCancel(ctx)
	consume(first)
	insert(0, 400)
	testkit.UntilCount(t, "the first 400 events applied", 400, effects)

	// Deleted under the running consumer; the relay creates it again.
	deleteStream()
	insert(400, 800)
	testkit.UntilCount(t, "the 400 events committed after the deletion applied by the running consumer", 800, effects)
	checkConsumed(t, pool, 800)

	// A consumer process started afresh after another deletion: its stored
	// positions count in the deleted stream.
	stopFirst()
	deleteStream()
	insert(800, 1000)
	testkit.UntilCount(t, "the relay to publish into the stream created again", 1000, func() int64 {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE status = 'published'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	})
	consume(ctx)
	testkit.UntilCount(t, "the 200 events of the third stream applied by a consumer started afresh", 1000, effects)
	checkConsumed(t, pool, 1000)
	var epochs int
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT epoch) FROM inbox_shard_position WHERE epoch <> ''`).Scan(&epochs); err != nil || epochs != 1 {
		t.Fatalf("the shards' positions name %d epochs (%v), want the one stream's now", epochs, err)
	}
}

// insertOrders commits events from to to-1 in one transaction, spread
// round-robin over aggregates "ord-0", "ord-1", ….
func insertOrders(ctx context.Context, t *testing.T, pool *pgxpool.Pool, from, to, aggregates int) {
	t.Helper()
	err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		for i := from; i < to; i++ {
			if _, err := outbox.Insert(ctx, tx, outbox.Event{
				AggregateType: "order", AggregateID: fmt.Sprintf("ord-%d", i%aggregates),
				Topic: "order.placed", EventType: "order.placed.v1", Payload: []byte(`{"n":` + strconv.Itoa(i) + `}`),
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// oneAttemptRig is an embedded JetStream, a test database and a relay on
// them that dead-letters an event at its first counted failure, running
// until the test ends. Its lease is the shortest RELAY_LEASE allows (1 s),
// so its publish timeout is the shortest a relay runs with (a third of
// it): a deleted stream must still be told from a stall within it.
type oneAttemptRig struct {
	t    *testing.T
	ctx  context.Context
	url  string
	pool *pgxpool.Pool
	b    *natsbroker.JetStream
	r    *outbox.Relay
}

func newOneAttemptRig(t *testing.T, namespace string) *oneAttemptRig {
	t.Helper()
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	g := &oneAttemptRig{t: t, url: srv.ClientURL(), pool: dbtest.New(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	g.ctx = ctx
	if g.b, err = natsbroker.Open(ctx, g.url, broker.Options{Namespace: namespace}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.b.Close() })
	g.r, err = outbox.NewRelay(g.pool, g.b, outbox.RelayConfig{
		Name: "relay", BatchSize: 25, PollInterval: 20 * time.Millisecond, Lease: time.Second,
		MaxAttempts: 1, Backoff: outbox.Backoff{Base: 50 * time.Millisecond, Cap: 500 * time.Millisecond},
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := g.r.Run(rctx); err != nil && rctx.Err() == nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { stop(); <-done })
	return g
}

// untilPublishedNoneDead waits until published events are published, and
// fails if one is dead-lettered first (what: the events awaited; cause:
// what the broker did).
func (g *oneAttemptRig) untilPublishedNoneDead(what string, published int64, cause string) {
	g.t.Helper()
	testkit.Until(g.t, what+" published, or one dead-lettered", func() bool {
		return g.count("published") == published || g.count("dead") > 0
	})
	if dead := g.count("dead"); dead != 0 {
		var lastErr string
		_ = g.pool.QueryRow(g.ctx, `SELECT last_error FROM outbox_event WHERE status = 'dead' LIMIT 1`).Scan(&lastErr)
		g.t.Fatalf("%d events dead-lettered because %s (one: %s)", dead, cause, lastErr)
	}
}

// count is how many of the rig's outbox events have status.
func (g *oneAttemptRig) count(status string) int64 {
	g.t.Helper()
	var n int64
	if err := g.pool.QueryRow(g.ctx, `SELECT count(*) FROM outbox_event WHERE status = $1`, status).Scan(&n); err != nil {
		g.t.Fatal(err)
	}
	return n
}

// checkStream reads every message of stream: want of them, once each (by
// event id), each of the aggregates' in sequence.
func checkStream(ctx context.Context, t *testing.T, js jetstream.JetStream, stream string, want, aggregates int) {
	t.Helper()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != uint64(want) {
		t.Fatalf("the stream holds %d messages, want %d", info.State.Msgs, want)
	}
	last := map[string]int64{}
	ids := map[string]bool{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		id := m.Header.Get(nats.MsgIdHdr)
		if ids[id] {
			t.Fatalf("event %s stored twice", id)
		}
		ids[id] = true
		agg := m.Header.Get(broker.HeaderAggregateID)
		n, err := strconv.ParseInt(m.Header.Get(broker.HeaderAggregateSeq), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if last[agg] != 0 && n != last[agg]+1 {
			t.Fatalf("%s: #%d stored after #%d", agg, n, last[agg])
		}
		last[agg] = n
	}
	if len(last) != aggregates {
		t.Fatalf("messages of %d aggregates, want %d", len(last), aggregates)
	}
}
