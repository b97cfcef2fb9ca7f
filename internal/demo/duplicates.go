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

// errRefusedPayload is the demo broker's refusal of a malformed payload.
var errRefusedPayload = errors.New("broker refused the message: payload fails the topic's schema")

func malformed(msg broker.Message) bool {
	var body struct{ Malformed bool }
	return json.Unmarshal(msg.Payload, &body) == nil && body.Malformed
}

func (p poisonPublisher) Publish(ctx context.Context, msg broker.Message) error {
	if malformed(msg) {
		return errRefusedPayload
	}
	return p.Publisher.Publish(ctx, msg)
}

// poisonBatchPublisher is poisonPublisher over a broker that publishes in
// batches (both adapters do): the relay then takes its batch path, as it
// does in production (a plain poisonPublisher hid PublishBatch, so the demo
// published one message per acknowledgement), and the refused messages
// fail on their own, the rest of the batch unaffected.
type poisonBatchPublisher struct {
	poisonPublisher
	batch broker.BatchPublisher
}

func (p poisonBatchPublisher) PublishBatch(ctx context.Context, msgs []broker.Message) []error {
	errs := make([]error, len(msgs))
	send, at := make([]broker.Message, 0, len(msgs)), make([]int, 0, len(msgs))
	for i, m := range msgs {
		if malformed(m) {
			errs[i] = errRefusedPayload
			continue
		}
		send, at = append(send, m), append(at, i)
	}
	if len(send) > 0 {
		for j, err := range p.batch.PublishBatch(ctx, send) {
			errs[at[j]] = err
		}
	}
	return errs
}

// newPoisonPublisher wraps b, keeping its batch path when it has one.
func newPoisonPublisher(b broker.Publisher) outbox.Publisher {
	p := poisonPublisher{Publisher: b}
	if bp, ok := b.(broker.BatchPublisher); ok {
		return poisonBatchPublisher{poisonPublisher: p, batch: bp}
	}
	return p
}
