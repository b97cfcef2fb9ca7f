package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/natsbroker"
	"github.com/sluice-dev/sluice/internal/broker/rabbitbroker"
	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// C1 (issue 12, part 3): the sharded consumer. Two systems on the R1 data
// set, on the nats and rabbit sinks:
//
//   - consume: the relays (sharded) and the consumer run together from a
//     full outbox until every event's effect is in the inbox, the consumer
//     killed twice on the way (at a third and two thirds: its broker
//     connection cut under it, then stopped; a fresh one takes over).
//     events/s = the whole burn-down, outbox to inbox. After the run, every
//     event must have exactly one effect, each aggregate's effects in
//     sequence order, and no stale drop; a run that breaks one fails.
//   - consume-drain: the relays publish everything first (not timed), then
//     the consumer alone drains the stream: events/s through the inbox.
//
// Run the 1,000,000-event check with
// bench/run -systems consume -sinks nats -consume-rows 1000000 -runs 1.

const (
	consumeShards = 16
	consumeName   = "bench" // the consumer's name (RabbitMQ: its shard queues' prefix)
)

func consumeConfig(o options) string {
	return fmt.Sprintf("%d shards, batch %d, %d relays (batch %d, ordered)", consumeShards, inbox.DefaultConsumeBatch, o.relays, o.batch)
}

// preloadConsume is preloadOutbox with the inbox emptied too.
func preloadConsume(ctx context.Context, pool *pgxpool.Pool, rows int) error {
	if _, err := pool.Exec(ctx, `TRUNCATE inbox_message, inbox_aggregate_version, inbox_consumer, inbox_consumer_shard, inbox_shard_position, consume_effect`); err != nil {
		return err
	}
	if err := preloadOutbox(ctx, pool, rows); err != nil {
		return err
	}
	return settle(ctx, pool, "inbox_message", "inbox_aggregate_version", "consume_effect")
}

// consumerPool is a pool of the consumer's own, as a consumer process has:
// one connection per shard plus its lock connection.
func consumerPool(ctx context.Context, p *pgxpool.Pool) (*pgxpool.Pool, error) {
	cfg := p.Config()
	cfg.MaxConns = consumeShards + 2
	return pgxpool.NewWithConfig(ctx, cfg)
}

func startRelays(ctx context.Context, pool *pgxpool.Pool, pub outbox.Publisher, relays, batch int) ([]*outbox.Relay, func(), error) {
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var rs []*outbox.Relay
	for i := range relays {
		r, err := outbox.NewRelay(pool, pub, outbox.RelayConfig{
			Name: fmt.Sprintf("bench-%d", i), BatchSize: batch, Shards: consumeShards,
			DisableListen: true, PollInterval: 5 * time.Millisecond,
		}, nil, nil)
		if err != nil {
			cancel()
			return nil, nil, err
		}
		rs = append(rs, r)
		wg.Go(func() { _ = r.Run(rctx) })
	}
	return rs, func() { cancel(); wg.Wait() }, nil
}

// consumerRun is one consumer "process": its own broker connection.
type consumerRun struct {
	conn   io.Closer
	cancel context.CancelFunc
	done   chan error
}

// shardBroker is a consumer's broker connection.
type shardBroker interface {
	broker.ShardSubscriber
	io.Closer
}

// consumeSink is a sink C1 runs on: it opens a consumer's own connection,
// and sets itself up for sharded events before the relays publish.
type consumeSink interface {
	sink
	openConsumer(ctx context.Context) (shardBroker, error)
	useShards() error
}

func (s *natsSink) openConsumer(ctx context.Context) (shardBroker, error) {
	return natsbroker.Open(ctx, s.srv.ClientURL(), broker.Options{Namespace: "bench"})
}

// useShards: the stream takes every subject already.
func (s *natsSink) useShards() error { return nil }

func (s *rabbitSink) openConsumer(ctx context.Context) (shardBroker, error) {
	return rabbitbroker.Open(ctx, s.url, broker.Options{Namespace: "bench"})
}

func startConsumer(ctx context.Context, cs consumeSink, pool *pgxpool.Pool) (*consumerRun, error) {
	conn, err := cs.openConsumer(ctx)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	c := &inbox.ShardedConsumer{Inbox: inbox.New(pool), Name: consumeName, Shards: consumeShards, RetryInterval: 100 * time.Millisecond}
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx, conn) }()
	return &consumerRun{conn: conn, cancel: cancel, done: done}, nil
}

// kill cuts the consumer's broker connection under its readers, then stops
// it: whatever batch was in flight is never committed.
func (c *consumerRun) kill() error {
	_ = c.conn.Close()
	c.cancel()
	return <-c.done
}

func (c *consumerRun) stop() error {
	c.cancel()
	err := <-c.done
	_ = c.conn.Close()
	return err
}

func effects(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM consume_effect`).Scan(&n)
	return n, err
}

func waitEffects(ctx context.Context, pool *pgxpool.Pool, n int) error {
	return waitFor(ctx, func() (bool, error) {
		got, err := effects(ctx, pool)
		return got >= n, err
	})
}

// runConsume is the burn-down with the consumer killed twice.
func runConsume(ctx context.Context, pool *pgxpool.Pool, pub broker.Publisher, rows, relays, batch int) (time.Duration, error) {
	ns, ok := pub.(consumeSink)
	if !ok {
		return 0, errors.New("consume runs on the nats and rabbit sinks only")
	}
	if err := ns.useShards(); err != nil {
		return 0, err
	}
	cpool, err := consumerPool(ctx, pool)
	if err != nil {
		return 0, err
	}
	defer cpool.Close()
	start := time.Now()
	_, stopRelays, err := startRelays(ctx, pool, ns, relays, batch)
	if err != nil {
		return 0, err
	}
	defer stopRelays()
	c, err := startConsumer(ctx, ns, cpool)
	if err != nil {
		return 0, err
	}
	for _, at := range []int{rows / 3, 2 * rows / 3} {
		if err := waitEffects(ctx, pool, at); err != nil {
			_ = c.stop()
			return 0, err
		}
		if err := c.kill(); err != nil {
			return 0, fmt.Errorf("consumer: %w", err)
		}
		if c, err = startConsumer(ctx, ns, cpool); err != nil {
			return 0, err
		}
	}
	err = waitEffects(ctx, pool, rows)
	el := time.Since(start)
	if serr := c.stop(); err == nil && serr != nil {
		err = serr
	}
	stopRelays()
	if err != nil {
		return el, err
	}
	return el, checkConsumed(ctx, pool, rows)
}

// runConsumeDrain times the consumer alone over a stream the relays filled.
func runConsumeDrain(ctx context.Context, pool *pgxpool.Pool, pub broker.Publisher, rows, relays, batch int) (time.Duration, error) {
	ns, ok := pub.(consumeSink)
	if !ok {
		return 0, errors.New("consume-drain runs on the nats and rabbit sinks only")
	}
	if err := ns.useShards(); err != nil {
		return 0, err
	}
	rs, stopRelays, err := startRelays(ctx, pool, ns, relays, batch)
	if err != nil {
		return 0, err
	}
	err = waitFor(ctx, func() (bool, error) {
		var n int64
		for _, r := range rs {
			n += r.Stats().Published
		}
		return n >= int64(rows), nil
	})
	stopRelays()
	if err != nil {
		return 0, err
	}
	cpool, err := consumerPool(ctx, pool)
	if err != nil {
		return 0, err
	}
	defer cpool.Close()
	start := time.Now()
	c, err := startConsumer(ctx, ns, cpool)
	if err != nil {
		return 0, err
	}
	err = waitEffects(ctx, pool, rows)
	el := time.Since(start)
	if serr := c.stop(); err == nil && serr != nil {
		err = serr
	}
	if err != nil {
		return el, err
	}
	return el, checkConsumed(ctx, pool, rows)
}

// checkConsumed fails a run in which an event's effect is missing or
// doubled, an aggregate's effects are out of sequence order, or anything
// was dropped as stale.
func checkConsumed(ctx context.Context, pool *pgxpool.Pool, rows int) error {
	var effects, twice, missing, disorder, stale int
	err := pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM consume_effect),
		       (SELECT count(*) FROM (SELECT event_id FROM consume_effect GROUP BY 1 HAVING count(*) > 1) d),
		       (SELECT count(*) FROM outbox_event e WHERE NOT EXISTS (SELECT 1 FROM consume_effect c WHERE c.event_id = e.id::text)),
		       (SELECT count(*) FROM (
		          SELECT aggregate_seq, row_number() OVER (PARTITION BY aggregate_id ORDER BY effect_id) AS nth
		            FROM consume_effect) x WHERE aggregate_seq <> nth),
		       coalesce((SELECT sum(stale) FROM inbox_consumer), 0)`).Scan(&effects, &twice, &missing, &disorder, &stale)
	if err != nil {
		return err
	}
	if effects != rows || twice != 0 || missing != 0 || disorder != 0 || stale != 0 {
		return fmt.Errorf("consumed wrong: %d effects for %d events, %d doubled, %d missing, %d out of order, %d stale",
			effects, rows, twice, missing, disorder, stale)
	}
	fmt.Printf("  check: %d events, each applied once, every aggregate in order, none stale\n", rows)
	return nil
}
