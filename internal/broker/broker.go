// Package broker carries outbox events to a message broker and back:
// a Publisher (acknowledged publishes only) and a Subscriber for NATS
// JetStream and for RabbitMQ, chosen by the URL's scheme. Every message
// carries its event id (the consumer's dedupe key) and its aggregate type, id
// and sequence (the consumer's ordering key) in broker-native places.
package broker

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"time"
)

// Message is one event on the wire.
type Message struct {
	ID            string // the outbox event id (UUIDv7): the dedupe key
	Topic         string // NATS subject suffix / RabbitMQ routing key
	AggregateType string
	AggregateID   string
	AggregateSeq  int64 // per-aggregate order, 1-based (0 = unknown)
	EventType     string
	Payload       []byte // JSON
	Headers       map[string]string
}

// Publisher sends a message and returns only once the broker has accepted it
// (JetStream ack / RabbitMQ publisher confirm). A nil error means stored.
type Publisher interface {
	Publish(ctx context.Context, msg Message) error
}

// Handler processes one delivered message. A nil error acknowledges it; on
// an error the subscriber calls it again with the same message (after a
// growing pause) before it reads the next one, so order is kept.
type Handler func(ctx context.Context, msg Message) error

// Subscriber delivers messages to h, one at a time and in broker order, on a
// durable subscription named consumer, until ctx ends.
type Subscriber interface {
	Subscribe(ctx context.Context, consumer string, h Handler) error
}

// Broker is a connected publisher and subscriber.
type Broker interface {
	Publisher
	Subscriber
	Close() error
}

// Options name the broker-side objects. The zero value is the production
// layout; tests give each run its own Namespace so parallel runs never share
// a stream, exchange or queue.
type Options struct {
	// Namespace (default "sluice") is the NATS subject prefix (subjects
	// "<ns>.<topic>", stream "<NS>" capturing "<ns>.>") and the RabbitMQ
	// topic exchange (queues "<ns>.<consumer>").
	Namespace string
	// AckWait (NATS only; default 30s) is how long JetStream waits for a
	// delivered message's ack before it delivers it again: after a consumer
	// crash, its unacknowledged message comes back after this long.
	AckWait time.Duration
}

// DefaultNamespace is the namespace when Options.Namespace is empty.
const DefaultNamespace = "sluice"

var namespaceRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

func (o Options) namespace() (string, error) {
	ns := o.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	if !namespaceRe.MatchString(ns) {
		return "", fmt.Errorf("broker: namespace %q must be 1–64 of a-z, 0-9, _ and -", ns)
	}
	return ns, nil
}

// ErrUnsupportedScheme reports a BROKER_URL that is neither NATS nor AMQP.
var ErrUnsupportedScheme = errors.New("broker: unsupported URL scheme (use nats:// or amqp://)")

// Open connects to the broker named by rawURL: nats:// or tls:// (NATS
// JetStream) or amqp:// or amqps:// (RabbitMQ).
func Open(ctx context.Context, rawURL string, opts Options) (Broker, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("broker: BROKER_URL is not a URL: %w", err)
	}
	switch u.Scheme {
	case "nats", "tls":
		return OpenNATS(ctx, rawURL, opts)
	case "amqp", "amqps":
		return OpenRabbit(ctx, rawURL, opts)
	}
	return nil, fmt.Errorf("%w: %q", ErrUnsupportedScheme, u.Scheme)
}

// ErrUnavailable marks a publish that failed because the broker could not be
// reached (connection down or reconnecting), not because of the message. The
// relay backs such events off without spending their attempts: a long outage
// must not dead-letter the head event of every aggregate, whose later events
// would then be published first and a retried dead one dropped as stale.
var ErrUnavailable = errors.New("broker: unavailable")

// Header names carrying the aggregate on both brokers.
const (
	HeaderAggregateType = "Sluice-Aggregate-Type"
	HeaderAggregateID   = "Sluice-Aggregate-Id"
	HeaderAggregateSeq  = "Sluice-Aggregate-Seq"
	HeaderEventType     = "Sluice-Event-Type"
)

var consumerRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func checkConsumer(name string) error {
	if !consumerRe.MatchString(name) {
		return fmt.Errorf("broker: consumer name %q must be 1–64 of A-Z, a-z, 0-9, _ and -", name)
	}
	return nil
}

// handleInPlace runs h until it succeeds or ctx ends, waiting between tries
// (100ms doubling to 5s) and calling stillWorking before each wait so the
// broker does not hand the message to someone else meanwhile. Retrying in
// place, instead of handing the message back, keeps per-aggregate order: a
// consumer that moved on to seq 2 would later drop the redelivered seq 1 as
// stale. The price is head-of-line blocking while the effect keeps failing
// (the consumer logs it and its lag grows), which is what an ordered
// consumer must do.
func handleInPlace(ctx context.Context, h Handler, msg Message, stillWorking func()) error {
	wait := 100 * time.Millisecond
	for {
		err := h(ctx, msg)
		if err == nil {
			return nil
		}
		if stillWorking != nil {
			stillWorking()
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, 5*time.Second)
	}
}
