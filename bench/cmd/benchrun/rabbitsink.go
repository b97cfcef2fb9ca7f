package main

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/rabbitbroker"
)

// rabbitSink is the machine's RabbitMQ (-rabbit, default 127.0.0.1:5672)
// through the product's adapter, rabbitbroker: persistent, mandatory
// publishes with publisher confirms, to a topic exchange of the bench's
// namespace. R1 runs bind one durable queue to every topic (a mandatory
// publish needs a queue to route to); C1 runs bind the sharded consumer's
// queues instead (useShards).
type rabbitSink struct {
	url string
	rb  *rabbitbroker.RabbitMQ
	n   atomic.Int64
}

// rabbitSinkQueue is the consumer name of R1's queue (nobody reads it).
const rabbitSinkQueue = "sink"

func startRabbit(ctx context.Context, url string) (*rabbitSink, error) {
	rb, err := rabbitbroker.Open(ctx, url, broker.Options{Namespace: "bench"})
	if err != nil {
		return nil, fmt.Errorf("RabbitMQ at %s: %w", url, err)
	}
	return &rabbitSink{url: url, rb: rb}, nil
}

func (s *rabbitSink) Publish(ctx context.Context, msg broker.Message) error {
	if err := s.rb.Publish(ctx, msg); err != nil {
		return err
	}
	s.n.Add(1)
	return nil
}

// PublishBatch passes rabbitbroker's batch publish through, so the relay
// sees the sink as the broker.BatchPublisher it is.
func (s *rabbitSink) PublishBatch(ctx context.Context, msgs []broker.Message) []error {
	errs := s.rb.PublishBatch(ctx, msgs)
	for _, err := range errs {
		if err == nil {
			s.n.Add(1)
		}
	}
	return errs
}

func (s *rabbitSink) name() string { return "rabbit" }
func (s *rabbitSink) count() int64 { return s.n.Load() }

// reset deletes the exchange and every queue a run filled, then declares
// them again (a new connection declares the exchange) with R1's queue.
func (s *rabbitSink) reset(ctx context.Context) error {
	s.n.Store(0)
	if err := s.rb.DeleteShardQueues(consumeName, consumeShards); err != nil {
		return err
	}
	if err := s.rb.DeleteNamespace(rabbitSinkQueue); err != nil {
		return err
	}
	_ = s.rb.Close()
	rb, err := rabbitbroker.Open(ctx, s.url, broker.Options{Namespace: "bench"})
	if err != nil {
		return err
	}
	s.rb = rb
	return s.rb.DeclareQueue(rabbitSinkQueue)
}

// useShards replaces R1's queue by the sharded consumer's: each sharded
// event then lands in its shard's queue only.
func (s *rabbitSink) useShards() error {
	if err := s.rb.DeclareShardQueues(consumeName, consumeShards); err != nil {
		return err
	}
	return s.rb.DeleteQueue(rabbitSinkQueue)
}

func (s *rabbitSink) close() {
	_ = s.rb.DeleteShardQueues(consumeName, consumeShards)
	_ = s.rb.DeleteNamespace(rabbitSinkQueue)
	_ = s.rb.Close()
}
