package inbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/natsbroker"
	"github.com/sluice-dev/sluice/internal/broker/natsembedded"
	"github.com/sluice-dev/sluice/internal/broker/rabbitbroker"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/testkit"
)

func msg(id, agg string, seq int64, pos uint64) broker.Message {
	return broker.Message{ID: id, Topic: "t", EventType: "t.v1", AggregateType: "invoice", AggregateID: agg, AggregateSeq: seq, Position: pos}
}

// One batch: a duplicate inside the batch, an id seen in an earlier batch,
// a sequence below the aggregate's applied one and a sequence that goes
// backwards inside the batch. Only the rest is applied, once, in order, and
// the position moves with it; a reader whose position is behind commits
// nothing.
func TestHandleBatchDedupesAndDropsStaleInOneTransaction(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	in := inbox.New(pool)
	pos, err := in.ReadShardPosition(ctx, "c", 4, 1)
	if err != nil || pos.At != 0 {
		t.Fatalf("fresh position %+v (%v)", pos, err)
	}
	n, err := in.HandleBatch(ctx, "c", &pos, []broker.Message{msg("a1", "a", 1, 10), msg("b1", "b", 1, 11), msg("a2", "a", 2, 12)}, inbox.RecordBatchEffect("c"))
	if err != nil || n != (inbox.BatchCounts{Applied: 3}) || pos.At != 12 {
		t.Fatalf("first batch %+v, position %d (%v)", n, pos.At, err)
	}
	stalePos := inbox.ShardPosition{Shards: 4, Shard: 1, At: 0}
	n, err = in.HandleBatch(ctx, "c", &pos, []broker.Message{
		msg("a2", "a", 2, 13), // seen before
		msg("a3", "a", 3, 14),
		msg("a3", "a", 3, 15), // twice in this batch
		msg("b0", "b", 1, 16), // not above b's applied sequence
		msg("b3", "b", 3, 17),
		msg("b2", "b", 2, 18), // below b3 applied just before in this batch
	}, inbox.RecordBatchEffect("c"))
	if err != nil || n != (inbox.BatchCounts{Applied: 2, Duplicates: 2, Stale: 2}) || pos.At != 18 {
		t.Fatalf("second batch %+v, position %d (%v)", n, pos.At, err)
	}
	// A second reader that started at 0 cannot commit behind the first.
	_, err = in.HandleBatch(ctx, "c", &stalePos, []broker.Message{msg("z1", "z", 1, 19)}, inbox.RecordBatchEffect("c"))
	if !errors.Is(err, inbox.ErrShardTaken) || stalePos.At != 0 {
		t.Fatalf("behind reader: %v, position %d; want ErrShardTaken", err, stalePos.At)
	}
	// A replay for another consumer moves the position but is not applied;
	// one for this consumer is (here a duplicate: the inbox remembers a1).
	forOther, forUs := msg("x1", "x", 1, 19), msg("a1", "a", 1, 20)
	forOther.ReplayTo, forUs.ReplayTo = "someone-else", "c"
	n, err = in.HandleBatch(ctx, "c", &pos, []broker.Message{forOther, forUs}, inbox.RecordBatchEffect("c"))
	if err != nil || n != (inbox.BatchCounts{Duplicates: 1}) || pos.At != 20 {
		t.Fatalf("replay batch %+v, position %d (%v)", n, pos.At, err)
	}
	var got []string
	rows, err := pool.Query(ctx, `SELECT event_id FROM consume_effect ORDER BY effect_id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[a1 b1 a2 a3 b3]" {
		t.Fatalf("effects %v, want [a1 b1 a2 a3 b3]", got)
	}
	var inboxRows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM inbox_message WHERE message_id = 'z1'`).Scan(&inboxRows); err != nil || inboxRows != 0 {
		t.Fatalf("the refused batch left %d inbox rows (%v)", inboxRows, err)
	}
	if p, err := in.ReadShardPosition(ctx, "c", 4, 1); err != nil || p.At != 20 {
		t.Fatalf("stored position %+v (%v), want 20", p, err)
	}
	stats, err := in.Stats(ctx)
	if err != nil || len(stats) != 1 || stats[0].Processed != 5 || stats[0].Duplicates != 3 || stats[0].Stale != 2 {
		t.Fatalf("stats %+v (%v)", stats, err)
	}
}

// A position counts in its epoch: a batch of a new epoch (the stream created
// again) stores its lower position with that epoch, and a reader that
// started from the old epoch's position cannot commit after it.
func TestHandleBatchStoresTheEpoch(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	in := inbox.New(pool)
	pos, err := in.ReadShardPosition(ctx, "c", 2, 0)
	if err != nil || pos.At != 0 || pos.Epoch != "" {
		t.Fatalf("fresh position %+v (%v)", pos, err)
	}
	withEpoch := func(m broker.Message, epoch string) broker.Message { m.Epoch = epoch; return m }
	if _, err := in.HandleBatch(ctx, "c", &pos, []broker.Message{withEpoch(msg("a1", "a", 1, 40), "e1")}, inbox.RecordBatchEffect("c")); err != nil ||
		pos != (inbox.ShardPosition{Shards: 2, Shard: 0, At: 40, Epoch: "e1"}) {
		t.Fatalf("first batch: position %+v (%v)", pos, err)
	}
	old := pos
	if _, err := in.HandleBatch(ctx, "c", &pos, []broker.Message{withEpoch(msg("a2", "a", 2, 3), "e2")}, inbox.RecordBatchEffect("c")); err != nil ||
		pos != (inbox.ShardPosition{Shards: 2, Shard: 0, At: 3, Epoch: "e2"}) {
		t.Fatalf("a batch of a new epoch: position %+v (%v), want 3 in e2", pos, err)
	}
	if _, err := in.HandleBatch(ctx, "c", &old, []broker.Message{withEpoch(msg("a3", "a", 3, 41), "e1")}, inbox.RecordBatchEffect("c")); !errors.Is(err, inbox.ErrShardTaken) {
		t.Fatalf("a reader still at the old epoch's position: %v, want ErrShardTaken", err)
	}
	if p, err := in.ReadShardPosition(ctx, "c", 2, 0); err != nil || p != pos {
		t.Fatalf("stored %+v (%v), want %+v", p, err, pos)
	}
}

// A failing effect commits nothing of its batch: no inbox row, no position.
func TestHandleBatchFailureCommitsNothing(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	in := inbox.New(pool)
	pos, err := in.ReadShardPosition(ctx, "c", 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	_, err = in.HandleBatch(ctx, "c", &pos, []broker.Message{msg("a1", "a", 1, 5)},
		func(context.Context, pgx.Tx, []broker.Message) error { return boom })
	if !errors.Is(err, boom) || pos.At != 0 {
		t.Fatalf("err %v, position %d", err, pos.At)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM inbox_message) + (SELECT position FROM inbox_shard_position)`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("a failed batch left %d rows/position (%v)", n, err)
	}
}

// preloadOutbox writes rows pending events round-robin over aggs aggregates
// with COPY (outbox.Insert one by one would take most of the test's time).
func preloadOutbox(t *testing.T, pool *pgxpool.Pool, rows, aggs int) {
	t.Helper()
	src := make([][]any, 0, rows)
	for i := range rows {
		id, err := uuid.NewV7()
		if err != nil {
			t.Fatal(err)
		}
		src = append(src, []any{id, "invoice", fmt.Sprintf("inv-%05d", i%aggs), int64(i/aggs + 1), "invoice.issued", "invoice.issued.v1", []byte(`{"total":"10.00"}`), []byte(`{}`)})
	}
	ctx := context.Background()
	if _, err := pool.CopyFrom(ctx, pgx.Identifier{"outbox_event"},
		[]string{"id", "aggregate_type", "aggregate_id", "aggregate_seq", "topic", "event_type", "payload", "headers"},
		pgx.CopyFromRows(src)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO outbox_aggregate (aggregate_type, aggregate_id, last_seq)
		SELECT aggregate_type, aggregate_id, max(aggregate_seq) FROM outbox_event GROUP BY 1, 2`); err != nil {
		t.Fatal(err)
	}
}

// shardHelperProcess runs a sharded consumer as this test binary's child
// process when SLUICE_SHARD_HELPER is set (the kill test starts it and
// kills it with SIGKILL), and never returns then.
func shardHelperProcess() bool {
	if os.Getenv("SLUICE_SHARD_HELPER") == "" {
		return false
	}
	ctx := context.Background()
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "shard helper:", err)
		os.Exit(1)
	}
	pool, err := db.Open(ctx, os.Getenv("SLUICE_SHARD_DB"))
	if err != nil {
		fail(err)
	}
	b, err := natsbroker.Open(ctx, os.Getenv("SLUICE_SHARD_NATS"), broker.Options{Namespace: os.Getenv("SLUICE_SHARD_NS")})
	if err != nil {
		fail(err)
	}
	c := &inbox.ShardedConsumer{Inbox: inbox.New(pool), Name: "sharded", Shards: 16, Batch: 500, RetryInterval: 100 * time.Millisecond}
	if v := os.Getenv("SLUICE_SHARD_REPORT"); v != "" { // the presence test's
		if c.ReportInterval, err = time.ParseDuration(v); err != nil {
			fail(err)
		}
	}
	fail(fmt.Errorf("consumer returned: %v", c.Run(ctx, b)))
	return true
}

// The sharded path on real parts, with the consumer killed twice: 60,000
// events over 3,000 aggregates, two relays publishing on 16 shards to
// embedded JetStream, and three consumer processes. The first (in this
// process, its own broker connection and pool) is killed by cutting its
// broker connection under its readers and stopping it; a standby that is a
// real child process takes its shards over and is killed with SIGKILL in
// the middle of its batches; a third process finishes. Every event is
// applied exactly once, each aggregate's effects are in sequence order with
// no gap, and nothing was ever dropped as stale. The 1,000,000-event run is
// in bench/ (benchrun -systems consume).
func TestShardedConsumerKeepsOrderThroughKills(t *testing.T) {
	t.Parallel()
	const total, aggs, shards = 60000, 3000, 16
	url := dbtest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pool, err := db.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	preloadOutbox(t, pool, total, aggs)
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	const ns = "shardkill"
	opts := broker.Options{Namespace: ns}

	var wg sync.WaitGroup
	startShardRelays(ctx, t, &wg, pool, natsAt(srv.ClientURL(), ns), 2, shards)

	// An in-process consumer "process": its own broker connection and pool.
	type proc struct {
		b      *natsbroker.JetStream
		pool   *pgxpool.Pool
		c      *inbox.ShardedConsumer
		cancel context.CancelFunc
		done   chan error
	}
	start := func() *proc {
		b, err := natsbroker.Open(ctx, srv.ClientURL(), opts)
		if err != nil {
			t.Fatal(err)
		}
		p, err := db.Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		pctx, pcancel := context.WithCancel(ctx)
		c := &inbox.ShardedConsumer{Inbox: inbox.New(p), Name: "sharded", Shards: shards, Batch: 500, RetryInterval: 100 * time.Millisecond}
		done := make(chan error, 1)
		go func() { done <- c.Run(pctx, b) }()
		return &proc{b: b, pool: p, c: c, cancel: pcancel, done: done}
	}
	stop := func(p *proc) {
		p.cancel()
		if err := <-p.done; err != nil {
			t.Errorf("consumer: %v", err)
		}
		p.b.Close()
		p.pool.Close()
	}
	applied := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM consume_effect`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitApplied := func(n int) {
		t.Helper()
		for applied() < n {
			if ctx.Err() != nil {
				t.Fatalf("only %d of %d effects before the deadline", applied(), n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	first := start()
	// The first process holds every shard before the standby starts, and
	// gives it half of them when it joins (TestShardsAreSharedAsProcessesComeAndGo):
	// had the child won the race for every lock, the first would have had
	// nothing to lose when it is killed (a fast machine once saw that).
	testkit.Eventually(t, "the first consumer running every shard", func() (bool, error) {
		return first.c.Running() == shards, nil
	})
	var childOut bytes.Buffer
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), "SLUICE_SHARD_HELPER=1", "SLUICE_SHARD_DB="+url,
		"SLUICE_SHARD_NATS="+srv.ClientURL(), "SLUICE_SHARD_NS="+ns)
	child.Stdout, child.Stderr = &childOut, &childOut
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill() }()
	waitApplied(total / 4)
	if first.c.Running() == 0 {
		t.Fatalf("the first consumer runs no shard")
	}
	// Kill 1: the broker connection goes away under the first process's
	// readers (a batch read but not committed is lost with it), then the
	// process stops; the child takes its shards over.
	first.b.Close()
	stop(first)
	killed1 := applied()
	// Kill 2: SIGKILL the child in the middle of its batches once it has
	// applied a good part of the rest alone.
	waitApplied(killed1 + total/4)
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	werr := child.Wait()
	var exit *exec.ExitError
	if !errors.As(werr, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the child did not die of SIGKILL: %v; output:\n%s", werr, childOut.String())
	}
	killed2 := applied()
	t.Logf("first killed at %d effects, child (SIGKILL) at %d", killed1, killed2)
	third := start()
	waitApplied(total)
	// Let anything left in flight land before counting (a duplicate would
	// show as a second effect row).
	time.Sleep(300 * time.Millisecond)
	stop(third)
	cancel()
	wg.Wait()

	checkConsumed(t, pool, total)
}

// shardBroker is what the sharded tests need of a broker connection.
type shardBroker interface {
	broker.Publisher
	broker.ShardSubscriber
	Close() error
}

// openBroker opens a connection to the test's broker.
type openBroker func(ctx context.Context) (shardBroker, error)

// natsAt opens connections to the JetStream at url in namespace ns.
func natsAt(url, ns string) openBroker {
	return func(ctx context.Context) (shardBroker, error) {
		b, err := natsbroker.Open(ctx, url, broker.Options{Namespace: ns})
		if err != nil {
			return nil, err
		}
		return b, nil
	}
}

// startShardRelays runs n relays (batch 500) publishing pool's outbox on
// shards through connections from open until ctx ends; wg waits for them.
func startShardRelays(ctx context.Context, t *testing.T, wg *sync.WaitGroup, pool *pgxpool.Pool, open openBroker, n, shards int) {
	t.Helper()
	for i := range n {
		b, err := open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		r, err := outbox.NewRelay(pool, b, outbox.RelayConfig{Name: fmt.Sprintf("relay-%d", i), BatchSize: 500, Shards: shards, PollInterval: 20 * time.Millisecond}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _ = r.Run(ctx) })
	}
}

// checkConsumed: every event applied exactly once, each aggregate's
// effects in sequence order with no gap, nothing dropped as stale.
func checkConsumed(t *testing.T, pool *pgxpool.Pool, total int) {
	t.Helper()
	bg := context.Background()
	var events, effects, twice, missing int
	if err := pool.QueryRow(bg, `
		SELECT (SELECT count(*) FROM outbox_event),
		       (SELECT count(*) FROM consume_effect),
		       (SELECT count(*) FROM (SELECT event_id FROM consume_effect GROUP BY 1 HAVING count(*) > 1) d),
		       (SELECT count(*) FROM outbox_event e WHERE NOT EXISTS (SELECT 1 FROM consume_effect c WHERE c.event_id = e.id::text))`).
		Scan(&events, &effects, &twice, &missing); err != nil {
		t.Fatal(err)
	}
	if events != total || effects != total || twice != 0 || missing != 0 {
		t.Fatalf("%d events, %d effects, %d applied twice, %d missing", events, effects, twice, missing)
	}
	// Per aggregate, the order effects were applied in is the sequence
	// order: the k-th effect of an aggregate is its event k.
	var disorder int
	if err := pool.QueryRow(bg, `
		SELECT count(*) FROM (
		  SELECT aggregate_seq, row_number() OVER (PARTITION BY aggregate_id ORDER BY effect_id) AS nth
		    FROM consume_effect) x
		 WHERE aggregate_seq <> nth`).Scan(&disorder); err != nil || disorder != 0 {
		t.Fatalf("%d effects out of per-aggregate order (%v)", disorder, err)
	}
	stats, err := inbox.Stats(bg, pool)
	if err != nil || len(stats) != 1 || stats[0].Processed != int64(total) || stats[0].Stale != 0 {
		t.Fatalf("inbox stats %+v (%v): want %d processed, none stale", stats, err, total)
	}
	t.Logf("inbox: %+v", stats[0])
}

// The same through RabbitMQ: a single-active-consumer queue per shard, a
// batch acknowledged at once after its transaction, and consumers killed
// twice by closing their connection under them (unacknowledged messages go
// back to their queue in order, to the next consumer).
func TestShardedConsumerOnRabbitKeepsOrderThroughKills(t *testing.T) {
	t.Parallel()
	const total, aggs, shards = 12000, 600, 8
	const url = "amqp://guest:guest@127.0.0.1:5672/"
	opts := broker.Options{Namespace: fmt.Sprintf("shardkill-%d", time.Now().UnixNano())}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	admin, err := rabbitbroker.Open(ctx, url, opts)
	if err != nil {
		t.Fatalf("RabbitMQ on 127.0.0.1:5672 (guest/guest) is needed: %v", err)
	}
	defer admin.Close()
	// The queues exist before the relays publish (the consumer declares
	// them too, but it starts after the relays here).
	if err := admin.DeclareShardQueues("sharded", shards); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := admin.DeleteShardQueues("sharded", shards); err != nil {
			t.Logf("cleanup: %v", err)
		}
		if err := admin.DeleteNamespace(); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	dbURL := dbtest.URL(t)
	pool, err := db.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	preloadOutbox(t, pool, total, aggs)
	var wg sync.WaitGroup
	for i := range 2 {
		b, err := rabbitbroker.Open(ctx, url, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		r, err := outbox.NewRelay(pool, b, outbox.RelayConfig{Name: fmt.Sprintf("relay-%d", i), BatchSize: 200, Shards: shards, PollInterval: 20 * time.Millisecond}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _ = r.Run(ctx) })
	}
	type proc struct {
		b      *rabbitbroker.RabbitMQ
		pool   *pgxpool.Pool
		cancel context.CancelFunc
		done   chan error
	}
	start := func() *proc {
		b, err := rabbitbroker.Open(ctx, url, opts)
		if err != nil {
			t.Fatal(err)
		}
		p, err := db.Open(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		pctx, pcancel := context.WithCancel(ctx)
		c := &inbox.ShardedConsumer{Inbox: inbox.New(p), Name: "sharded", Shards: shards, Batch: 200, RetryInterval: 100 * time.Millisecond}
		done := make(chan error, 1)
		go func() { done <- c.Run(pctx, b) }()
		return &proc{b: b, pool: p, cancel: pcancel, done: done}
	}
	kill := func(p *proc) {
		p.b.Close()
		p.cancel()
		if err := <-p.done; err != nil {
			t.Errorf("consumer: %v", err)
		}
		p.pool.Close()
	}
	applied := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM consume_effect`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitApplied := func(n int) {
		t.Helper()
		for applied() < n {
			if ctx.Err() != nil {
				t.Fatalf("only %d of %d effects before the deadline", applied(), n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	a, b := start(), start()
	waitApplied(total / 3)
	kill(a)
	c := start()
	waitApplied(2 * total / 3)
	kill(b)
	waitApplied(total)
	time.Sleep(300 * time.Millisecond)
	kill(c)
	cancel()
	wg.Wait()
	checkConsumed(t, pool, total)
}

// Shards are shared as processes come and go, while events flow: a process
// holding all 16 gives half to one that joins, a third that may read only
// shards 0 and 1 gets them, and when the second stops the first takes its
// shards back (those the third may not read). Every event is applied
// exactly once and in order per aggregate through the hand-overs.
func TestShardsAreSharedAsProcessesComeAndGo(t *testing.T) {
	t.Parallel()
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	testShardsShared(t, natsAt(srv.ClientURL(), "share"), 20000)
}

// The same on RabbitMQ: a hand-over cancels the shard's single active
// consumer (what it had not acknowledged goes back to the queue, in order)
// and the next process's consumer becomes the active one.
func TestShardsAreSharedOnRabbitAsProcessesComeAndGo(t *testing.T) {
	t.Parallel()
	const url = "amqp://guest:guest@127.0.0.1:5672/"
	opts := broker.Options{Namespace: fmt.Sprintf("share-%d", time.Now().UnixNano())}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := rabbitbroker.Open(ctx, url, opts)
	if err != nil {
		t.Fatalf("RabbitMQ on 127.0.0.1:5672 (guest/guest) is needed: %v", err)
	}
	defer admin.Close()
	// The queues exist before the relays publish.
	if err := admin.DeclareShardQueues("sharded", 16); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := admin.DeleteShardQueues("sharded", 16); err != nil {
			t.Logf("cleanup: %v", err)
		}
		if err := admin.DeleteNamespace(); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	// Fewer events: with this test's batches of 10 the adapter hands over
	// only what has arrived, often 1–2 messages a transaction, and the
	// slow effect makes that about 200 events/s.
	testShardsShared(t, func(ctx context.Context) (shardBroker, error) {
		b, err := rabbitbroker.Open(ctx, url, opts)
		if err != nil {
			return nil, err
		}
		return b, nil
	}, 6000)
}

// testShardsShared preloads total events over 1,000 aggregates, has two
// relays publish them on 16 shards through open's broker, and moves the
// shards between consumer processes while they are applied.
func testShardsShared(t *testing.T, open openBroker, total int) {
	const aggs, shards = 1000, 16
	url := dbtest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pool, err := db.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	preloadOutbox(t, pool, total, aggs)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	startShardRelays(ctx, t, &wg, pool, open, 2, shards)
	// Small, slow batches, so the events outlast the hand-overs.
	record := inbox.RecordBatchEffect("sharded")
	slow := func(ctx context.Context, tx pgx.Tx, msgs []broker.Message) error {
		time.Sleep(15 * time.Millisecond)
		return record(ctx, tx, msgs)
	}
	type proc struct {
		c      *inbox.ShardedConsumer
		cancel context.CancelFunc
		done   chan error
	}
	start := func(owned []int) *proc {
		b, err := open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		p, err := db.Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		pctx, pcancel := context.WithCancel(ctx)
		c := &inbox.ShardedConsumer{Inbox: inbox.New(p), Name: "sharded", Shards: shards, Owned: owned, Batch: 10, Effect: slow,
			RetryInterval: 50 * time.Millisecond, ReportInterval: 50 * time.Millisecond}
		done := make(chan error, 1)
		go func() {
			done <- c.Run(pctx, b)
			b.Close()
			p.Close()
		}()
		return &proc{c: c, cancel: pcancel, done: done}
	}
	stop := func(p *proc) {
		t.Helper()
		p.cancel()
		if err := <-p.done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	}
	applied := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM consume_effect`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	running := func(what string, want map[*proc]int) {
		t.Helper()
		testkit.Eventually(t, what, func() (bool, error) {
			ok := true
			var got []int
			for p, n := range want {
				got = append(got, p.c.Running())
				ok = ok && p.c.Running() == n
			}
			return ok, fmt.Errorf("running %v", got)
		})
	}

	a := start(nil)
	running("the first process running every shard", map[*proc]int{a: 16})
	b := start(nil)
	running("half the shards moved to the second process", map[*proc]int{a: 8, b: 8})
	if n := applied(); n >= total {
		t.Fatalf("every event applied before the shards moved (%d): the hand-over was not tested under load", n)
	}
	c := start([]int{0, 1})
	// The third reads only shards 0 and 1, which the first two may hold one
	// each or both in one: 6 and 8 or 7 and 7 are both at rest (each of the
	// two at or above the share, 6, with no process below it that may read
	// their shards). A CI run ended at 7, 7 and 2 where the test wanted
	// 6, 8 and 2.
	testkit.Eventually(t, "the third process running its two shards", func() (bool, error) {
		ra, rb, rc := a.c.Running(), b.c.Running(), c.c.Running()
		return rc == 2 && ra+rb == 14 && min(ra, rb) >= 6, fmt.Errorf("running %d, %d and %d", ra, rb, rc)
	})
	stop(b)
	running("the second process's shards back with the first", map[*proc]int{a: 14, c: 2})
	moved := applied()
	testkit.Eventually(t, "every event applied", func() (bool, error) {
		n := applied()
		return n >= total, fmt.Errorf("%d of %d applied", n, total)
	})
	t.Logf("hand-overs done at %d of %d events applied", moved, total)
	time.Sleep(300 * time.Millisecond) // anything in flight lands before counting
	// Each running process's report says what it applied and when.
	testkit.Eventually(t, "the reports to carry each process's applied count", func() (bool, error) {
		rows, _, err := inbox.ListProcesses(ctx, pool)
		if err != nil || len(rows) != 2 {
			return false, fmt.Errorf("rows %+v (%v)", rows, err)
		}
		for _, r := range rows {
			p := a
			if r.Owned != nil {
				p = c
			}
			if n := p.c.Counts().Applied; r.Applied != n || n == 0 || r.AppliedAt == nil || r.AppliedAt.After(r.SeenAt) {
				return false, fmt.Errorf("row %+v: want %d applied, last before its report", r, n)
			}
		}
		return true, nil
	})
	stop(a)
	stop(c)
	checkConsumed(t, pool, total)
}
