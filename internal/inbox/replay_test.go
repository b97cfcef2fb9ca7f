package inbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/brokerurl"
	"github.com/sluice-dev/sluice/internal/broker/natsembedded"
	"github.com/sluice-dev/sluice/internal/broker/rabbitbroker"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// replayRig is a relay and consumers on a real broker.
type replayRig struct {
	t         *testing.T
	pool      *pgxpool.Pool
	ctx       context.Context
	consumers map[string]*inbox.Consumer
	wg        sync.WaitGroup
}

func newReplayRig(t *testing.T, url string, opts broker.Options, consumers ...string) *replayRig {
	ctx, cancel := context.WithCancel(context.Background())
	r := &replayRig{t: t, pool: dbtest.New(t), ctx: ctx, consumers: map[string]*inbox.Consumer{}}
	t.Cleanup(func() { cancel(); r.wg.Wait() })
	pub, err := brokerurl.Open(ctx, url, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	relay, err := outbox.NewRelay(r.pool, pub, outbox.RelayConfig{BatchSize: 500, PollInterval: 20 * time.Millisecond}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.wg.Go(func() { _ = relay.Run(ctx) })
	for _, name := range consumers {
		sub, err := brokerurl.Open(ctx, url, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Close() })
		c := &inbox.Consumer{Inbox: inbox.New(r.pool), Name: name}
		r.consumers[name] = c
		r.wg.Go(func() {
			if err := c.Run(ctx, sub); err != nil && ctx.Err() == nil {
				t.Errorf("consumer %s: %v", name, err)
			}
		})
	}
	return r
}

// seed writes aggregates×perAggregate pending events in id order.
func (r *replayRig) seed(aggregates, perAggregate int) {
	var rows [][]any
	for seq := 1; seq <= perAggregate; seq++ {
		for a := range aggregates {
			id, err := uuid.NewV7()
			if err != nil {
				r.t.Fatal(err)
			}
			rows = append(rows, []any{id, "order", fmt.Sprintf("o-%d", a), int64(seq), "orders", "order.changed.v1", []byte(`{}`)})
		}
	}
	if _, err := r.pool.CopyFrom(r.ctx, pgx.Identifier{"outbox_event"},
		[]string{"id", "aggregate_type", "aggregate_id", "aggregate_seq", "topic", "event_type", "payload"}, pgx.CopyFromRows(rows)); err != nil {
		r.t.Fatal(err)
	}
}

func (r *replayRig) effects(consumer string) (total, distinct int) {
	r.t.Helper()
	if err := r.pool.QueryRow(r.ctx, `SELECT count(*), count(DISTINCT event_id) FROM consume_effect WHERE consumer = $1`, consumer).
		Scan(&total, &distinct); err != nil {
		r.t.Fatal(err)
	}
	return total, distinct
}

// replay runs a replay job of every published event of topic orders to
// completion (as the console's runner does).
func (r *replayRig) replay(to string) outbox.Job {
	r.t.Helper()
	job, err := db.WithTxV(r.ctx, r.pool, func(tx pgx.Tx) (outbox.Job, error) {
		return outbox.CreateJob(r.ctx, tx, outbox.JobRequest{Kind: outbox.JobReplay, Filter: outbox.Filter{Topic: "orders"},
			Reason: "consumer restored from backup", RequestedBy: "test", ReplayTo: to, ChunkSize: 2000})
	})
	if err != nil {
		r.t.Fatal(err)
	}
	runner, err := outbox.NewJobRunner(r.pool, outbox.JobRunnerConfig{}, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	if ran, err := runner.RunOnce(r.ctx); !ran || err != nil {
		r.t.Fatalf("replay job: ran %v, %v", ran, err)
	}
	return job
}

// A replay of 10,000 published events reaches the broker with their
// original ids: the consumer, its inbox intact, counts every one as a
// duplicate and applies none of them twice.
func TestReplayOf10000EventsIsAbsorbedByTheInbox(t *testing.T) {
	t.Parallel()
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	r := newReplayRig(t, srv.ClientURL(), broker.Options{Namespace: "replay"}, "ledger")
	const n = 10_000
	r.seed(1000, n/1000)
	testkit.UntilCount(t, "the first delivery applied", n, func() int64 { total, _ := r.effects("ledger"); return int64(total) })

	job := r.replay("")
	if job.Matched != n {
		t.Fatalf("replay matched %d, want %d", job.Matched, n)
	}
	c := r.consumers["ledger"]
	testkit.UntilCount(t, "every replayed message received", n, func() int64 { return c.Counts().Duplicates })
	if total, distinct := r.effects("ledger"); total != n || distinct != n {
		t.Fatalf("%d effects for %d events after the replay, want each of %d once", total, distinct, n)
	}
	if got := c.Counts(); got.Applied != n || got.Duplicates != n || got.Stale != 0 {
		t.Fatalf("consumer counts %+v, want %d applied and %d duplicates", got, n, n)
	}
	var replayed int
	if err := r.pool.QueryRow(r.ctx, `SELECT count(*) FROM outbox_event WHERE status = 'published' AND replay_count = 1`).Scan(&replayed); err != nil || replayed != n {
		t.Fatalf("%d events published again (%v), want %d", replayed, err, n)
	}
}

// A replay for one consumer reaches only that consumer: on NATS the others
// acknowledge it unhandled, on RabbitMQ it goes straight to the consumer's
// queue. The consumer that lost its data applies every event again; the
// other applies nothing and sees no duplicate.
func TestReplayToOneConsumerNATS(t *testing.T) {
	t.Parallel()
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	replayToOne(t, srv.ClientURL(), broker.Options{Namespace: "replay-one"})
}

func TestReplayToOneConsumerRabbitMQ(t *testing.T) {
	t.Parallel()
	const url = "amqp://guest:guest@127.0.0.1:5672/"
	opts := broker.Options{Namespace: fmt.Sprintf("replay-%d", time.Now().UnixNano())}
	rb, err := rabbitbroker.Open(context.Background(), url, opts)
	if err != nil {
		t.Fatalf("RabbitMQ on 127.0.0.1:5672 (guest/guest) is needed: %v", err)
	}
	defer rb.Close()
	for _, c := range []string{"alpha", "beta"} {
		if err := rb.DeclareQueue(c); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = rb.DeleteNamespace("alpha", "beta") })
	replayToOne(t, url, opts)
}

func replayToOne(t *testing.T, url string, opts broker.Options) {
	r := newReplayRig(t, url, opts, "alpha", "beta")
	const n = 200
	r.seed(20, n/20)
	testkit.Until(t, "both consumers applied the first delivery", func() bool {
		a, _ := r.effects("alpha")
		b, _ := r.effects("beta")
		return a >= n && b >= n
	})
	// beta loses its data.
	if _, err := r.pool.Exec(r.ctx, `
		DELETE FROM consume_effect WHERE consumer = 'beta';
		DELETE FROM inbox_message WHERE consumer = 'beta';
		DELETE FROM inbox_aggregate_version WHERE consumer = 'beta'`); err != nil {
		t.Fatal(err)
	}
	r.replay("beta")
	testkit.Until(t, "beta applied the replay", func() bool { b, _ := r.effects("beta"); return b >= n })
	// A new event after the replay: once alpha has applied it, alpha has
	// read past every replayed message (one stream or queue, in order).
	if err := db.WithTx(r.ctx, r.pool, func(tx pgx.Tx) error {
		_, err := outbox.Insert(r.ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "sentinel", Topic: "orders",
			EventType: "order.changed.v1", Payload: []byte(`{}`)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// The consumer counts a message after its transaction commits, so the
	// waits are on its counts, not on the effects in the database (an
	// effect committed a moment before its count once failed this in CI).
	testkit.Until(t, "alpha applied the event after the replay", func() bool { return r.consumers["alpha"].Counts().Applied >= n+1 })
	if got := r.consumers["alpha"].Counts(); got.Applied != n+1 || got.Duplicates != 0 || got.Stale != 0 {
		t.Fatalf("alpha %+v: a replay for beta reached alpha", got)
	}
	testkit.Until(t, "beta applied the event after the replay", func() bool { return r.consumers["beta"].Counts().Applied >= 2*n+1 })
	if total, distinct := r.effects("beta"); total != n+1 || distinct != n+1 {
		t.Fatalf("beta: %d effects of %d events, want %d once each", total, distinct, n+1)
	}
	if got := r.consumers["beta"].Counts(); got.Applied != 2*n+1 || got.Stale != 0 {
		t.Fatalf("beta %+v, want %d applied", got, 2*n+1)
	}
}
