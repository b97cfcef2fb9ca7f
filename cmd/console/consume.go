package main

import (
	"context"

	"github.com/sluice-dev/sluice/internal/config"
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
	consumer := &inbox.Consumer{Inbox: in, Name: c.Consumer, Tracing: w.tracing.Provider()}
	log.Info("consumer started", "consumer", c.Consumer)
	err = consumer.Run(ctx, w.broker)
	n := consumer.Counts()
	log.Info("consumer stopped", "consumer", c.Consumer, "applied", n.Applied, "duplicates", n.Duplicates, "stale", n.Stale)
	return err
}
