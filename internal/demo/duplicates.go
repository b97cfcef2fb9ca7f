package demo

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// redeliveringSubscriber hands a small share of messages to the handler
// twice, the way a broker redelivers a message whose acknowledgement was lost
// (JetStream after AckWait, RabbitMQ after a dropped channel). The publish
// side would not show it: JetStream drops a republished Nats-Msg-Id inside
// its duplicate window. It lets the demo show the inbox absorbing duplicates
// without waiting for a real network fault.
type redeliveringSubscriber struct {
	broker.Subscriber
	share float64 // 0..1 of messages delivered twice
}

func (s redeliveringSubscriber) Subscribe(ctx context.Context, consumer string, h broker.Handler) error {
	return s.Subscriber.Subscribe(ctx, consumer, func(ctx context.Context, msg broker.Message) error {
		if err := h(ctx, msg); err != nil {
			return err
		}
		if rand.Float64() < s.share {
			return h(ctx, msg)
		}
		return nil
	})
}

// poisonPublisher refuses the messages the order workload marked as
// malformed, the way a broker with a schema registry would, so the demo
// shows backoff, dead letters, and one stuck aggregate not holding up the
// others — and gives operators something to retry or dead-letter.
type poisonPublisher struct {
	outbox.Publisher
}

func (p poisonPublisher) Publish(ctx context.Context, msg broker.Message) error {
	var body struct{ Malformed bool }
	if json.Unmarshal(msg.Payload, &body) == nil && body.Malformed {
		return errors.New("broker refused the message: payload fails the topic's schema")
	}
	return p.Publisher.Publish(ctx, msg)
}
