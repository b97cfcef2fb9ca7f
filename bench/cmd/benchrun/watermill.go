package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/broker"
)

// watermill-sql v4's outbox pattern: events are written (enveloped by the
// forwarder's publisher) into a SQL topic table; the forwarder subscribes to
// that table with the SQL subscriber and publishes each event to the sink.
const wmForwarderTopic = "sluice_bench_forwarder"

type wmSink struct {
	pub  broker.Publisher
	done *atomic.Int64
}

func (s wmSink) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if err := s.pub.Publish(context.Background(), broker.Message{
			ID: m.UUID, Topic: topic, AggregateType: "payment",
			AggregateID: m.Metadata.Get("aggregate_id"), EventType: "payment.requested.v1", Payload: m.Payload,
		}); err != nil {
			return err
		}
		s.done.Add(1)
	}
	return nil
}

func (wmSink) Close() error { return nil }

func wmSchema() wmsql.DefaultPostgreSQLSchema {
	return wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: 100}
}

func preloadWatermill(ctx context.Context, pool *pgxpool.Pool, rows int) error {
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS "watermill_`+wmForwarderTopic+`", "watermill_offsets_`+wmForwarderTopic+`"`); err != nil {
		return err
	}
	sqlPub, err := wmsql.NewPublisher(wmsql.BeginnerFromPgx(pool), wmsql.PublisherConfig{
		SchemaAdapter: wmSchema(), AutoInitializeSchema: true,
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	pub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: wmForwarderTopic})
	a := aggregates(rows)
	const chunk = 1000
	for lo := 0; lo < rows; lo += chunk {
		var msgs []*message.Message
		for i := lo; i < min(rows, lo+chunk); i++ {
			m := message.NewMessage(watermill.NewUUID(), message.Payload(payload))
			m.Metadata.Set("aggregate_id", fmt.Sprintf("pay-%07d", i%a))
			msgs = append(msgs, m)
		}
		if err := pub.Publish("payments", msgs...); err != nil {
			return fmt.Errorf("watermill preload: %w", err)
		}
	}
	return settle(ctx, pool, "watermill_"+wmForwarderTopic)
}

// runWatermill forwards the preloaded events to the sink; the clock stops
// when the sink has them all.
func runWatermill(ctx context.Context, pool *pgxpool.Pool, pub broker.Publisher, rows int) (time.Duration, error) {
	var done atomic.Int64
	sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromPgx(pool), wmsql.SubscriberConfig{
		SchemaAdapter:    wmSchema(),
		OffsetsAdapter:   wmsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
		PollInterval:     10 * time.Millisecond,
	}, watermill.NopLogger{})
	if err != nil {
		return 0, err
	}
	fwd, err := forwarder.NewForwarder(sub, wmSink{pub: pub, done: &done}, watermill.NopLogger{}, forwarder.Config{
		ForwarderTopic: wmForwarderTopic, CloseTimeout: 10 * time.Second,
	})
	if err != nil {
		return 0, err
	}
	start := time.Now()
	runErr := make(chan error, 1)
	go func() { runErr <- fwd.Run(ctx) }()
	werr := waitFor(ctx, func() (bool, error) {
		select {
		case err := <-runErr:
			return false, fmt.Errorf("forwarder stopped: %v", err)
		default:
		}
		return done.Load() >= int64(rows), nil
	})
	el := time.Since(start)
	_ = fwd.Close()
	_ = sub.Close()
	return el, werr
}
