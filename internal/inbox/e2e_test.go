package inbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/brokerurl"
	"github.com/sluice-dev/sluice/internal/broker/natsembedded"
	"github.com/sluice-dev/sluice/internal/broker/rabbitbroker"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// The whole path on real parts: writers insert events in their
// transactions → two relays → embedded NATS JetStream → the reference
// consumer → inbox. Every event's effect is present exactly once, and each
// aggregate's effects were applied in sequence order.
func TestNATSEndToEnd(t *testing.T) {
	t.Parallel()
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	endToEnd(t, srv.ClientURL(), broker.Options{Namespace: "e2e"})
}

// The same path through the RabbitMQ server on this machine (absent: a
// failure naming it, never a skip).
func TestRabbitEndToEnd(t *testing.T) {
	t.Parallel()
	const url = "amqp://guest:guest@127.0.0.1:5672/"
	opts := broker.Options{Namespace: fmt.Sprintf("e2e-%d", time.Now().UnixNano())}
	r, err := rabbitbroker.Open(context.Background(), url, opts)
	if err != nil {
		t.Fatalf("RabbitMQ on 127.0.0.1:5672 (guest/guest) is needed: %v", err)
	}
	defer r.Close()
	// The queue exists before the first publish: a publish no queue can
	// receive is refused by the publisher.
	if err := r.DeclareQueue("reference"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.DeleteNamespace("reference"); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	endToEnd(t, url, opts)
}

func endToEnd(t *testing.T, url string, opts broker.Options) {
	pool := dbtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	var wg sync.WaitGroup
	run := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && ctx.Err() == nil {
				t.Error(err)
			}
		}()
	}
	notifier := outbox.NewNotifier(pool, 20*time.Millisecond, nil)
	run(func() error { return notifier.Run(ctx) })
	for i := range 2 {
		b, err := brokerurl.Open(ctx, url, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		r, err := outbox.NewRelay(pool, b, outbox.RelayConfig{Name: fmt.Sprintf("relay-%d", i), BatchSize: 50}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		run(func() error { return r.Run(ctx) })
	}
	sub, err := brokerurl.Open(ctx, url, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	consumer := &inbox.Consumer{Inbox: inbox.New(pool), Name: "reference"}
	run(func() error { return consumer.Run(ctx, sub) })

	const writers, perWriter, aggregates = 4, 100, 30
	ids := make(chan string, writers*perWriter)
	var wwg sync.WaitGroup
	for w := range writers {
		wwg.Add(1)
		go func() {
			defer wwg.Done()
			for i := range perWriter {
				err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
					ins, err := outbox.Insert(ctx, tx, outbox.Event{
						AggregateType: "invoice", AggregateID: fmt.Sprintf("inv-%d", (w*perWriter+i)%aggregates),
						Topic: "invoice.issued", EventType: "invoice.issued.v1", Payload: []byte(`{"total":"10.00"}`),
					})
					if err == nil {
						ids <- ins.ID.String()
					}
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
				notifier.Poke()
			}
		}()
	}
	wwg.Wait()
	close(ids)
	const total = writers * perWriter

	deadline := time.Now().Add(60 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM consume_effect WHERE consumer = 'reference'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n >= total {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d effects applied before the deadline", n, total)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	wg.Wait()

	applied := map[string]int{}
	rows, err := pool.Query(context.Background(), `SELECT event_id, count(*) FROM consume_effect GROUP BY event_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		applied[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for id := range ids {
		if applied[id] != 1 {
			t.Fatalf("event %s applied %d times, want once", id, applied[id])
		}
		delete(applied, id)
	}
	if len(applied) != 0 {
		t.Fatalf("%d effects for events nobody inserted", len(applied))
	}
	// Applied order per aggregate = sequence order, with no gap.
	var disorder int
	err = pool.QueryRow(context.Background(), `
		SELECT count(*) FROM (
		  SELECT aggregate_seq, row_number() OVER (PARTITION BY aggregate_id ORDER BY effect_id) AS nth
		    FROM consume_effect) x
		 WHERE aggregate_seq <> nth`).Scan(&disorder)
	if err != nil || disorder != 0 {
		t.Fatalf("%d effects out of per-aggregate order (%v)", disorder, err)
	}
	if c := consumer.Counts(); c.Stale != 0 || c.Applied != total {
		t.Fatalf("consumer counts %+v, want %d applied, none stale", c, total)
	}
	if b, err := outbox.ReadBacklog(context.Background(), pool); err != nil || b.Pending+b.InFlight+b.Dead != 0 {
		t.Fatalf("backlog after drain %+v (%v)", b, err)
	}
}
