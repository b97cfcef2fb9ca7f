package inbox_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/brokertest"
	"github.com/sluice-dev/sluice/internal/broker/rabbitbroker"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// Two processes consuming one name on RabbitMQ (a second replica, a rolling
// restart's new process, a standby) must never share an aggregate's events.
// The first retries seq 1 in place (its effect fails for a while); the
// second, registered meanwhile, is handed nothing: seq 2 and 3 wait in the
// queue until the first applied seq 1. Until 7 December the queue was a
// plain competing-consumers queue: the second took seq 2 at once, raised the
// aggregate's high-water mark, and seq 1, applied after, was dropped as
// stale and never applied. When the first stops, the second takes over.
func TestRabbitASecondConsumerOfANameWaitsWhileTheFirstRetries(t *testing.T) {
	t.Parallel()
	opts := broker.Options{Namespace: brokertest.Namespace(t)}
	admin, err := rabbitbroker.Open(context.Background(), brokertest.RabbitURL, opts)
	if err != nil {
		t.Fatalf("RabbitMQ on 127.0.0.1:5672 (guest/guest) is needed: %v", err)
	}
	t.Cleanup(func() {
		if err := admin.DeleteNamespace("reference"); err != nil {
			t.Logf("cleanup: %v", err)
		}
		admin.Close()
	})
	if err := admin.DeclareQueue("reference"); err != nil {
		t.Fatal(err)
	}
	pool := dbtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	msgs := brokertest.Messages(4, 1) // one aggregate, seq 1..4
	for _, m := range msgs[:3] {
		if err := admin.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}

	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	record := inbox.RecordEffect("reference")
	var (
		holding   atomic.Bool // the first consumer's effect fails on seq 1
		heldOnce  sync.Once
		held      = make(chan struct{})
		appliedBy sync.Map // message id → "first" or "second"
	)
	holding.Store(true)
	start := func(ctx context.Context, who string) *inbox.Consumer {
		sub, err := rabbitbroker.Open(ctx, brokertest.RabbitURL, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sub.Close() })
		c := &inbox.Consumer{Inbox: inbox.New(pool), Name: "reference",
			Effect: func(ctx context.Context, tx pgx.Tx, m broker.Message) error {
				if who == "first" && m.AggregateSeq == 1 && holding.Load() {
					heldOnce.Do(func() { close(held) })
					return errors.New("a transient failure of the effect")
				}
				appliedBy.Store(m.ID, who)
				return record(ctx, tx, m)
			}}
		wg.Go(func() {
			if err := c.Run(ctx, sub); err != nil && ctx.Err() == nil {
				t.Errorf("%s consumer: %v", who, err)
			}
		})
		return c
	}
	firstCtx, stopFirst := context.WithCancel(ctx)
	defer stopFirst()
	first := start(firstCtx, "first")
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("the first consumer never received seq 1")
	}
	second := start(ctx, "second")

	conn, err := amqp.Dial(brokertest.RabbitURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// Once the queue counts the second consumer, RabbitMQ has already
	// handed it whatever it would (a consume and its first deliveries are
	// one step of the queue's process).
	var q amqp.Queue
	testkit.Eventually(t, "the queue to count both consumers", func() (bool, error) {
		q, err = ch.QueueDeclarePassive(admin.Queue("reference"), true, false, false, false, nil)
		return err == nil && q.Consumers == 2, err
	})
	if q.Messages != 2 {
		t.Fatalf("while the first consumer retries seq 1 the queue holds %d ready messages, want 2 (seq 2 and 3): the second consumer was handed messages of the aggregate", q.Messages)
	}

	holding.Store(false)
	effects := func() int64 {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM consume_effect WHERE consumer = 'reference'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testkit.UntilCount(t, "seq 1 to 3 applied", 3, effects)
	for _, m := range msgs[:3] {
		if who, _ := appliedBy.Load(m.ID); who != "first" {
			t.Fatalf("seq %d applied by %v, want the first consumer (the queue's active one)", m.AggregateSeq, who)
		}
	}

	// The first stops (a rolling restart): the second takes the queue.
	stopFirst()
	if err := admin.Publish(ctx, msgs[3]); err != nil {
		t.Fatal(err)
	}
	testkit.UntilCount(t, "seq 4 applied", 4, effects)
	if who, _ := appliedBy.Load(msgs[3].ID); who != "second" {
		t.Fatalf("seq 4 applied by %v, want the second consumer once the first stopped", who)
	}
	rows, err := pool.Query(ctx, `SELECT aggregate_seq FROM consume_effect WHERE consumer = 'reference' ORDER BY effect_id`)
	if err != nil {
		t.Fatal(err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if len(seqs) != 4 || seqs[0] != 1 || seqs[1] != 2 || seqs[2] != 3 || seqs[3] != 4 {
		t.Fatalf("effects applied for seqs %v, want 1 2 3 4 once each, in order", seqs)
	}
	if a, b := first.Counts(), second.Counts(); a.Stale+b.Stale != 0 {
		t.Fatalf("stale drops: first %+v, second %+v; want none", a, b)
	}
}
