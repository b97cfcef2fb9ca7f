// Package broker is the contract between Sluice and a message broker: a
// Message, a Publisher (acknowledged publishes only), a Subscriber, the
// errors and header names both sides agree on. It imports the standard
// library only, so code that writes or applies an event (outbox, inbox,
// payments) never links a broker client or server.
//
// Each broker lives in a package of its own, as riverdriver keeps River apart
// from pgx: natsbroker (NATS JetStream), rabbitbroker (RabbitMQ), natsembedded
// (an in-process NATS server for the demo and tests), and brokerurl, which
// picks an adapter from a BROKER_URL's scheme. Every message carries its event
// id (the consumer's dedupe key) and its aggregate type, id and sequence (the
// consumer's ordering key) in broker-native places.
package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	// Shards > 0 publishes the message on shard Shard of Shards (see
	// ShardOf): NATS subject "<ns>.s<Shards>.<Shard>.<topic>", RabbitMQ
	// routing key "s<Shards>.<Shard>.<topic>". 0: unsharded ("<ns>.<topic>").
	Shards, Shard int
	// Position is where a sharded subscription read the message in its
	// shard (the JetStream stream sequence), increasing; 0 when the broker
	// has none. Consumers store it with their effects to resume exactly.
	Position uint64
	// Epoch names the sequence Position counts in (JetStream: the stream's
	// creation time; "" when the broker has none). A stream deleted and
	// created again counts from 1 again, so a position means nothing
	// without its epoch: consumers store both.
	Epoch string
	// Replay is how many times an operator asked for this event again (0:
	// its first publish). A replay keeps ID (an inbox that remembers the
	// event absorbs it) but is a new broker message: an adapter whose broker
	// drops repeated ids within a window (JetStream's Nats-Msg-Id) gives
	// each replay its own broker-side id and carries ID beside it.
	Replay int
	// ReplayTo names the one consumer a replay is for ("" : every consumer
	// of the topic); see each adapter for how it is routed.
	ReplayTo string
}

// HeaderEventID carries the event id when the broker-side message id is
// not the event id (a replay on JetStream): the consumer's dedupe key.
const HeaderEventID = "Sluice-Event-Id"

// HeaderReplayTo carries Message.ReplayTo.
const HeaderReplayTo = "Sluice-Replay-To"

// ShardOf is the shard, in [0, shards), of an aggregate: FNV-1a of its type
// and id, so every event of one aggregate lands on one shard, on every
// relay, in every version. shards <= 0 gives 0.
func ShardOf(aggregateType, aggregateID string, shards int) int {
	if shards <= 1 {
		return 0
	}
	// FNV-1a, 32 bits, written out so the hash is pinned here and not by a
	// library's choice.
	h := uint32(2166136261)
	add := func(s string) {
		for i := 0; i < len(s); i++ {
			h ^= uint32(s[i])
			h *= 16777619
		}
	}
	add(aggregateType)
	add("\x00")
	add(aggregateID)
	return int(h % uint32(shards))
}

// ShardToken is the subject / routing key tokens that carry a shard:
// "s<shards>.<shard>". The count is part of it, so events published under
// another shard count never mix with these.
func ShardToken(shards, shard int) string {
	return fmt.Sprintf("s%d.%d", shards, shard)
}

// MaxShards bounds a shard count: each shard is a subscription, a queue and
// a lock.
const MaxShards = 1024

// Publisher sends a message and returns only once the broker has accepted it
// (JetStream ack / RabbitMQ publisher confirm). A nil error means stored, as
// durably as the broker stores what it acknowledges: RabbitMQ confirms a
// persistent message once it is on disk; JetStream acknowledges a write
// synced only every two minutes unless the server runs with sync_interval
// always or the stream is replicated (README, "NATS JetStream"; the demo's
// embedded server does neither: its store is thrown away).
type Publisher interface {
	Publish(ctx context.Context, msg Message) error
}

// BatchPublisher is a Publisher that can have many messages in flight at
// once: PublishBatch sends every message of msgs, then waits for the
// broker's acks, and returns one error per message, in msgs' order (nil:
// stored, as Publish's nil). A failed message does not stop the ones after
// it, so a caller that needs two messages stored in order must not put both
// in one batch. An adapter implements it when its broker acknowledges
// publishes asynchronously (JetStream's acks, RabbitMQ's publisher
// confirms); the relay uses it when present.
type BatchPublisher interface {
	Publisher
	PublishBatch(ctx context.Context, msgs []Message) []error
}

// Handler processes one delivered message. A nil error acknowledges it; on
// an error the subscriber calls it again with the same message (after a
// growing pause) before it reads the next one, so order is kept.
type Handler func(ctx context.Context, msg Message) error

// Subscriber delivers messages to h, one at a time and in broker order, on a
// durable subscription named consumer, until ctx ends (then it returns nil).
// It returns an error when it can no longer consume.
type Subscriber interface {
	Subscribe(ctx context.Context, consumer string, h Handler) error
}

// BatchHandler handles one batch of a shard's messages, in shard order. A
// nil error acknowledges the whole batch; an error hands the whole batch
// back (the subscription ends with that error and is started again from the
// consumer's own stored position, or the broker redelivers the batch).
type BatchHandler func(ctx context.Context, batch []Message) error

// ShardSubscription names one shard's ordered subscription.
type ShardSubscription struct {
	Consumer string // durable name / queue prefix: ValidateConsumer
	Shards   int    // shard count the relays publish with (1..MaxShards)
	Shard    int    // in [0, Shards)
	Batch    int    // most messages per BatchHandler call (default 500)
	// After is the position of the last message the consumer committed (0:
	// none); the subscription starts right after it, unless Epoch names
	// another epoch than the broker's now (the stream was created again
	// since): then it starts at the beginning. Epoch "" is a position stored
	// before epochs were (trusted while it is within the stream). Adapters
	// without positions (RabbitMQ) ignore both.
	After uint64
	Epoch string
}

// ShardSubscriber reads one shard's messages in order and hands them to h
// in batches of at most Batch, each batch as soon as it is available, until
// ctx ends (nil) or h fails (h's error). Only one reader may run a shard at
// a time: the caller provides that exclusivity (inbox.ShardedConsumer
// holds a PostgreSQL lock per shard).
type ShardSubscriber interface {
	SubscribeShard(ctx context.Context, s ShardSubscription, h BatchHandler) error
}

// Broker is a connected publisher and subscriber.
type Broker interface {
	Publisher
	Subscriber
	Close() error
}

// Options name the broker-side objects and tune the adapters. The zero value
// is the production layout; tests give each run its own Namespace so parallel
// runs never share a stream, exchange or queue.
type Options struct {
	// Namespace (default "sluice") is the NATS subject prefix (subjects
	// "<ns>.<topic>", stream "<NS>" capturing "<ns>.>") and the RabbitMQ
	// topic exchange (queues "<ns>.<consumer>").
	Namespace string
	// AckWait (NATS only; default 30s) is how long JetStream waits for a
	// delivered message's ack before it delivers it again: after a consumer
	// crash, its unacknowledged message comes back after this long.
	AckWait time.Duration
	// MaxConsumeFailures (default 10, DefaultMaxConsumeFailures) is how
	// many times in a row Subscribe may fail to consume (RabbitMQ: connection
	// refused, channel closed, queue declaration refused; JetStream: the
	// consumer or its stream deleted) before it gives up and returns the
	// last error. It waits between tries, 500ms doubling to 30s
	// (RetryConsume), so the default rides out about two minutes of
	// outage. Negative: never give up.
	MaxConsumeFailures int
	// Logger receives what an adapter cannot return (the consume failures
	// Subscribe retries); nil: slog.Default(). Never a payload.
	Logger *slog.Logger
}

// DefaultNamespace is the namespace when Options.Namespace is empty.
const DefaultNamespace = "sluice"

var namespaceRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

// ValidNamespace is the namespace the options name (DefaultNamespace when
// empty), or an error when it is not 1–64 of a-z, 0-9, _ and -.
func (o Options) ValidNamespace() (string, error) {
	ns := o.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	if !namespaceRe.MatchString(ns) {
		return "", fmt.Errorf("broker: namespace %q must be 1–64 of a-z, 0-9, _ and -", ns)
	}
	return ns, nil
}

// ErrUnavailable marks a publish that failed because the broker could not
// take any message — connection down or reconnecting, no stream or no room
// to store, a nack, or no answer to any publish within the timeout — not
// because of the message (each adapter says which of its errors are). The
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
	// HeaderShard is "<shard>/<shards>" on sharded messages, so a reader
	// tells the shard tokens from the topic.
	HeaderShard = "Sluice-Shard"
)

var consumerRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidateConsumer refuses a consumer name a broker could not use as a
// durable consumer or queue name.
func ValidateConsumer(name string) error {
	if !consumerRe.MatchString(name) {
		return fmt.Errorf("broker: consumer name %q must be 1–64 of A-Z, a-z, 0-9, _ and -", name)
	}
	return nil
}

// HandleInPlace runs h until it succeeds or ctx ends, waiting between tries
// (100ms doubling to 5s) and calling stillWorking before each wait so the
// broker does not hand the message to someone else meanwhile. It returns
// nil once h succeeded, h's last error when ctx ended first. Retrying in
// place, instead of handing the message back, keeps per-aggregate order: a
// consumer that moved on to seq 2 would later drop the redelivered seq 1 as
// stale. The price is head-of-line blocking while the effect keeps failing
// (the consumer logs it and its lag grows), which is what an ordered
// consumer must do. Every adapter's Subscribe calls it.
func HandleInPlace(ctx context.Context, h Handler, msg Message, stillWorking func()) error {
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
