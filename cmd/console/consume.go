package main

import (
	"context"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/brokerurl"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/inbox"
)

func runConsume(ctx context.Context, e env, args []string) error {
	var c config.Consume
	if _, err := configure(e, "consume", "Reference consumer: reads events from the broker on a durable subscription and applies\n"+
		"each one once through the inbox. Its effect records one consume_effect row per event\n"+
		"(event id, topic, type, aggregate, sequence; never the payload); an event older than\n"+
		"its aggregate's last applied sequence is dropped as stale. Stops cleanly on SIGINT/SIGTERM.", &c, args, nil); err != nil {
		return err
	}
	log := newLogger(e.stderr, c.LogLevel)
	pool, err := db.OpenCurrent(ctx, c.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	b, err := brokerurl.Open(ctx, c.Broker.URL, broker.Options{Namespace: c.Broker.Namespace, Logger: log})
	if err != nil {
		return err
	}
	defer b.Close()
	reg := newProcessRegistry()
	in, err := inbox.Open(pool, inbox.WithMetrics(reg), inbox.WithLogger(log))
	if err != nil {
		return err
	}
	stop, err := startMetricsListener(c.MetricsAddr, reg, log)
	if err != nil {
		return err
	}
	defer stop()
	consumer := &inbox.Consumer{Inbox: in, Name: c.Consumer}
	log.Info("consumer started", "consumer", c.Consumer)
	err = consumer.Run(ctx, b)
	n := consumer.Counts()
	log.Info("consumer stopped", "consumer", c.Consumer, "applied", n.Applied, "duplicates", n.Duplicates, "stale", n.Stale)
	return err
}
