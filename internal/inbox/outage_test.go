package inbox_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/brokerurl"
	"github.com/sluice-dev/sluice/internal/broker/natsembedded"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// SECURITY case 10, broker down: the embedded NATS server is shut down in
// the middle of the stream while writers keep committing events, and started
// again on the same port and store folder. Relays keep failing, backing off
// and retrying (no event dead-letters during a short outage); clients
// reconnect on their own; after recovery every committed event's effect is
// applied exactly once (the inbox absorbs whatever the outage duplicated:
// publishes buffered by the client and re-sent on reconnect, acks that never
// came back), none is lost, and each aggregate's effects keep their order.
func TestBrokerOutageLosesNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv, err := natsembedded.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	port := srv.Port()
	var srvMu sync.Mutex
	defer func() {
		srvMu.Lock()
		defer srvMu.Unlock()
		if srv != nil {
			srv.Shutdown()
		}
	}()
	url := srv.ClientURL()
	// A short ack wait: a delivery lost with the connection comes back soon.
	opts := broker.Options{Namespace: "outage", AckWait: 3 * time.Second}
	pool := dbtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
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
	var relays []*outbox.Relay
	for i := range 2 {
		b, err := brokerurl.Open(ctx, url, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		r, err := outbox.NewRelay(pool, b, outbox.RelayConfig{
			Name: fmt.Sprintf("relay-%d", i), BatchSize: 25, Lease: 6 * time.Second, PollInterval: 100 * time.Millisecond,
			// Few attempts and short waits: the outage fails publishes far
			// more often than this, and must be ridden out by backoff
			// without spending attempts, never by dead-lettering.
			MaxAttempts: 2, Backoff: outbox.Backoff{Base: 50 * time.Millisecond, Cap: 500 * time.Millisecond},
		}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		relays = append(relays, r)
		run(func() error { return r.Run(ctx) })
	}
	sub, err := brokerurl.Open(ctx, url, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	consumer := &inbox.Consumer{Inbox: inbox.New(pool), Name: "reference"}
	run(func() error { return consumer.Run(ctx, sub) })

	effects := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(DISTINCT event_id) FROM consume_effect WHERE consumer = 'reference'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	failures := func() int64 {
		var n int64
		for _, r := range relays {
			n += r.Stats().Failed
		}
		return n
	}
	// Writers commit events all along: before, during and after the outage.
	const writers, aggregates = 4, 100
	var (
		idsMu    sync.Mutex
		ids      []string
		stop     atomic.Bool
		inserted atomic.Int64
		wwg      sync.WaitGroup
	)
	for w := range writers {
		wwg.Add(1)
		go func() {
			defer wwg.Done()
			for i := 0; !stop.Load(); i++ {
				err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
					ins, err := outbox.Insert(ctx, tx, outbox.Event{
						AggregateType: "order", AggregateID: fmt.Sprintf("ord-%d", (w*7919+i)%aggregates),
						Topic: "order.placed", EventType: "order.placed.v1", Payload: []byte(`{"total":"10.00"}`),
					})
					if err == nil {
						idsMu.Lock()
						ids = append(ids, ins.ID.String())
						idsMu.Unlock()
					}
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
				inserted.Add(1)
				notifier.Poke()
				time.Sleep(10 * time.Millisecond) // a steady stream, not one burst
			}
		}()
	}

	testkit.Until(t, "the stream to flow before the outage", func() bool { return effects() >= 200 })
	srvMu.Lock()
	srv.Shutdown()
	srv = nil
	srvMu.Unlock()
	down := inserted.Load()
	// The relays must see the outage: failed publishes, backed off.
	testkit.Until(t, "relays to fail publishing while the broker is down", func() bool { return failures() >= 40 })
	testkit.Until(t, "writers to commit during the outage", func() bool { return inserted.Load() >= down+150 })
	restarted, err := natsembedded.StartAt(dir, port)
	if err != nil {
		t.Fatalf("restart NATS on port %d: %v", port, err)
	}
	srvMu.Lock()
	srv = restarted
	srvMu.Unlock()
	testkit.Until(t, "writers to commit after the restart", func() bool { return inserted.Load() >= down+300 })
	stop.Store(true)
	wwg.Wait()
	total := len(ids)

	// Eventually drained; progress is logged for whoever reads a failure.
	deadline := time.Now().Add(4 * time.Minute)
	nextReport := time.Now().Add(15 * time.Second)
	for effects() < total {
		if c := consumer.Counts(); c.Stale > 0 {
			// A redelivery that arrives after later events of its aggregate
			// is dropped as stale: its effect is lost, not deduplicated.
			t.Fatalf("the consumer dropped %d events as stale: delivered out of order after the outage, their effects are lost", c.Stale)
		}
		if now := time.Now(); now.After(nextReport) || now.After(deadline) {
			nextReport = now.Add(15 * time.Second)
			b, _ := outbox.ReadBacklog(ctx, pool)
			t.Logf("draining: %d of %d effects, backlog %+v, relays %+v / %+v, consumer %+v",
				effects(), total, b, relays[0].Stats(), relays[1].Stats(), consumer.Counts())
			if now.After(deadline) {
				t.Fatalf("only %d of %d effects after the restart", effects(), total)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()

	bg := context.Background()
	applied := map[string]int{}
	rows, err := pool.Query(bg, `SELECT event_id, count(*) FROM consume_effect WHERE consumer = 'reference' GROUP BY event_id`)
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
	for _, id := range ids {
		if applied[id] != 1 {
			t.Fatalf("event %s applied %d times, want once", id, applied[id])
		}
		delete(applied, id)
	}
	if len(applied) != 0 {
		t.Fatalf("%d effects for events nobody committed", len(applied))
	}
	var disorder int
	if err := pool.QueryRow(bg, `
		SELECT count(*) FROM (
		  SELECT aggregate_seq, row_number() OVER (PARTITION BY aggregate_id ORDER BY effect_id) AS nth
		    FROM consume_effect) x
		 WHERE aggregate_seq <> nth`).Scan(&disorder); err != nil || disorder != 0 {
		t.Fatalf("%d effects out of per-aggregate order (%v)", disorder, err)
	}
	if b, err := outbox.ReadBacklog(bg, pool); err != nil || b.Pending+b.InFlight+b.Dead != 0 {
		t.Fatalf("backlog after the drain %+v (%v): want nothing pending and nothing dead", b, err)
	}
	c := consumer.Counts()
	if c.Applied != int64(total) || c.Stale != 0 {
		t.Fatalf("consumer counts %+v, want %d applied, none stale", c, total)
	}
	t.Logf("%d events (%d committed while the broker was down or coming back), %d failed publishes, %d duplicates absorbed by the inbox",
		total, int64(total)-down, failures(), c.Duplicates)
}
