package demo

import (
	"context"
	"math/rand/v2"

	"github.com/sluice-dev/sluice/internal/broker"
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
