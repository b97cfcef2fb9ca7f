package main

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/outbox"
)

func runConsume(ctx context.Context, e env, args []string) error {
	var c config.Consume
	if _, err := configure(e, "consume", "Reference consumer: reads events from the broker on a durable subscription and applies\n"+
		"each one once through the inbox. Its effect records one consume_effect row per event\n"+
		"(event id, topic, type, aggregate, sequence; never the payload); an event older than\n"+
		"its aggregate's last applied sequence is dropped as stale. Stops cleanly on SIGINT/SIGTERM.\n"+
		"With --shards N (the relays' OUTBOX_SHARDS) it reads the N shards in parallel, each in order,\n"+
		"a batch per transaction; processes split the shards between them (a PostgreSQL lock per shard),\n"+
		"share them evenly as processes come and go, and take over a stopped process's shards.", &c, args, nil); err != nil {
		return err
	}
	w, err := openBrokerWorker(ctx, e, "consume", c.Common, c.Broker)
	if err != nil {
		return err
	}
	defer w.Close()
	log := w.log
	in, err := inbox.Open(w.pool, inbox.WithMetrics(w.reg), inbox.WithLogger(log))
	if err != nil {
		return err
	}
	if err := w.serveMetrics(c.MetricsAddr); err != nil {
		return err
	}
	warnIfRelaysPublishElsewhere(ctx, w, c.Shards)
	if c.Shards > 0 {
		sub, ok := w.broker.(broker.ShardSubscriber)
		if !ok {
			return fmt.Errorf("consume: this broker cannot read shards; set OUTBOX_SHARDS=0")
		}
		// A connection per shard it may run, plus the one that holds the
		// shard locks and one for the process's reports (and the reads of
		// its peers' that share the shards): the default pool (4 on 2
		// cores) would serialize them, and a report waiting behind busy
		// readers would make a live process look silent.
		running := c.Shards
		if c.Owned != nil {
			running = len(c.Owned)
		}
		pcfg := w.pool.Config()
		pcfg.MaxConns = int32(min(running, 32) + 2)
		spool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			return fmt.Errorf("consume: database pool: %w", err)
		}
		defer spool.Close()
		sin, err := inbox.Open(spool, inbox.WithMetrics(w.reg), inbox.WithLogger(log))
		if err != nil {
			return err
		}
		sc := &inbox.ShardedConsumer{Inbox: sin, Name: c.Consumer, Shards: c.Shards, Owned: c.Owned, Batch: c.BatchSize, Tracing: w.tracing.Provider()}
		log.Info("consumer started", "consumer", c.Consumer, "shards", c.Shards, "owned", c.ShardsOwned)
		err = sc.Run(ctx, sub)
		n := sc.Counts()
		log.Info("consumer stopped", "consumer", c.Consumer, "applied", n.Applied, "duplicates", n.Duplicates, "stale", n.Stale)
		return err
	}
	consumer := &inbox.Consumer{Inbox: in, Name: c.Consumer, Tracing: w.tracing.Provider()}
	log.Info("consumer started", "consumer", c.Consumer)
	err = consumer.Run(ctx, w.broker)
	n := consumer.Counts()
	log.Info("consumer stopped", "consumer", c.Consumer, "applied", n.Applied, "duplicates", n.Duplicates, "stale", n.Stale)
	return err
}

// warnIfRelaysPublishElsewhere says at start when the running relays publish
// on another shard count than this consumer reads (the inbox page flags it
// too, once the consumer reports): it would read subjects or queues nobody
// publishes on, and look merely idle.
func warnIfRelaysPublishElsewhere(ctx context.Context, w *brokerWorker, shards int) {
	running, err := outbox.ReadRelays(ctx, w.pool)
	if err != nil || running.Alive() == 0 || slices.Contains(running.Shards, shards) {
		return
	}
	w.log.Warn("consume: the running relays publish on another shard count; this consumer will not see their events: give every relay and consumer the same OUTBOX_SHARDS",
		"outbox_shards", shards, "running_relays_outbox_shards", running.Shards)
}
