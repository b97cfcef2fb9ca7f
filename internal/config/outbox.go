package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// Broker names the message broker (relay, consume).
type Broker struct {
	URL       string // BROKER_URL: nats://… (JetStream) or amqp://… (RabbitMQ)
	Namespace string // BROKER_NAMESPACE: NATS subject prefix and stream / RabbitMQ exchange
	Shards    int    // OUTBOX_SHARDS: shard count relays publish with and consumers read (0: unsharded)
}

func (b *Broker) register(f *Flags) {
	f.String(&b.URL, "broker-url", "BROKER_URL", "", "nats://host:4222 (NATS JetStream) or amqp://user:pass@host:5672/ (RabbitMQ)")
	f.String(&b.Namespace, "broker-namespace", "BROKER_NAMESPACE", broker.DefaultNamespace, "NATS subject prefix and stream name / RabbitMQ exchange name")
	f.Int(&b.Shards, "shards", "OUTBOX_SHARDS", 0, "publish / read events on this many shards by aggregate (0: unsharded); relays and consumers must agree")
}

func (b *Broker) check(ck *Check) {
	if strings.TrimSpace(b.URL) == "" {
		ck.Failf("BROKER_URL is required (nats://… for NATS JetStream or amqp://… for RabbitMQ)")
	} else {
		ck.URL("BROKER_URL", b.URL, "nats", "tls", "amqp", "amqps")
	}
	if b.Namespace == "" {
		ck.Failf("BROKER_NAMESPACE must not be empty")
	}
	if b.Shards < 0 || b.Shards > broker.MaxShards {
		ck.Failf("OUTBOX_SHARDS must be 0 (unsharded) to %d (got %d)", broker.MaxShards, b.Shards)
	}
}

// Relay configures `console relay`.
type Relay struct {
	Common
	Broker
	MetricsAddr        string
	BatchSize          int
	Lease              time.Duration
	PollInterval       time.Duration
	MaxAttempts        int
	BackoffBase        time.Duration
	BackoffCap         time.Duration
	Ordering           bool
	PublishConcurrency int
}

// Register adds the relay's flags.
func (c *Relay) Register(f *Flags) {
	c.Common.register(f)
	c.Broker.register(f)
	f.String(&c.MetricsAddr, "metrics-addr", "METRICS_ADDR", "", "serve /metrics on this host:port (empty: no metrics listener)")
	f.Int(&c.BatchSize, "batch-size", "RELAY_BATCH_SIZE", outbox.DefaultBatchSize, "events claimed per statement")
	f.Duration(&c.Lease, "lease", "RELAY_LEASE", outbox.DefaultLease, "how long a claim is held before another relay may take it over")
	f.Duration(&c.PollInterval, "poll-interval", "RELAY_POLL_INTERVAL", outbox.DefaultPollInterval, "longest idle sleep between claims (LISTEN/NOTIFY wakes the relay earlier)")
	f.Int(&c.MaxAttempts, "max-attempts", "RELAY_MAX_ATTEMPTS", outbox.DefaultMaxAttempts, "failed publish attempts before an event goes dead")
	f.Duration(&c.BackoffBase, "backoff-base", "RELAY_BACKOFF_BASE", outbox.DefaultBackoffBase, "delay after the first failed attempt (doubles per attempt, jittered)")
	f.Duration(&c.BackoffCap, "backoff-cap", "RELAY_BACKOFF_CAP", outbox.DefaultBackoffCap, "largest delay between attempts")
	f.Bool(&c.Ordering, "ordering", "RELAY_ORDERING", true, "hold an event back while an earlier event of its aggregate is pending")
	f.Int(&c.PublishConcurrency, "publish-concurrency", "RELAY_PUBLISH_CONCURRENCY", outbox.DefaultPublishConcurrency, "aggregates published in parallel within a batch")
}

// Validate checks the relay's settings.
func (c *Relay) Validate() error {
	var ck Check
	c.Common.check(&ck)
	c.Broker.check(&ck)
	ck.Addr("METRICS_ADDR", c.MetricsAddr)
	ck.Positive("RELAY_BATCH_SIZE", c.BatchSize)
	if c.BatchSize > 10000 {
		ck.Failf("RELAY_BATCH_SIZE must be at most 10000 (got %d): a claim should stay a short statement", c.BatchSize)
	}
	ck.PositiveDuration("RELAY_LEASE", c.Lease)
	ck.PositiveDuration("RELAY_POLL_INTERVAL", c.PollInterval)
	ck.Positive("RELAY_MAX_ATTEMPTS", c.MaxAttempts)
	ck.PositiveDuration("RELAY_BACKOFF_BASE", c.BackoffBase)
	ck.PositiveDuration("RELAY_BACKOFF_CAP", c.BackoffCap)
	if c.BackoffCap < c.BackoffBase {
		ck.Failf("RELAY_BACKOFF_CAP (%s) must not be below RELAY_BACKOFF_BASE (%s)", c.BackoffCap, c.BackoffBase)
	}
	ck.Positive("RELAY_PUBLISH_CONCURRENCY", c.PublishConcurrency)
	if c.Lease > 0 && c.Lease < time.Second {
		ck.Failf("RELAY_LEASE must be at least 1s (got %s): a publish must fit well inside it", c.Lease)
	}
	return ck.Err()
}

// Consume configures `console consume`.
type Consume struct {
	Common
	Broker
	MetricsAddr string
	Consumer    string
	ShardsOwned string // CONSUME_SHARDS_OWNED: "0-7,12"; empty: all
	Owned       []int  // ShardsOwned parsed by Validate (nil: all)
	BatchSize   int    // CONSUME_BATCH_SIZE
}

// Register adds the consumer's flags.
func (c *Consume) Register(f *Flags) {
	c.Common.register(f)
	c.Broker.register(f)
	f.String(&c.MetricsAddr, "metrics-addr", "METRICS_ADDR", "", "serve /metrics on this host:port (empty: no metrics listener)")
	f.String(&c.Consumer, "consumer", "CONSUMER_NAME", "reference", "durable subscription and inbox consumer name (A-Z, a-z, 0-9, _ and -)")
	f.String(&c.ShardsOwned, "shards-owned", "CONSUME_SHARDS_OWNED", "", "with --shards: the shards this process may run, e.g. 0-7,12 (empty: all; a shard runs in one process at a time)")
	f.Int(&c.BatchSize, "batch-size", "CONSUME_BATCH_SIZE", inbox.DefaultConsumeBatch, "with --shards: most events of a shard applied in one transaction")
}

// Validate checks the consumer's settings.
func (c *Consume) Validate() error {
	var ck Check
	c.Common.check(&ck)
	c.Broker.check(&ck)
	ck.Addr("METRICS_ADDR", c.MetricsAddr)
	if !validConsumerName(c.Consumer) {
		ck.Failf("CONSUMER_NAME: %q must be 1–64 of A-Z, a-z, 0-9, _ and -", c.Consumer)
	}
	ck.Positive("CONSUME_BATCH_SIZE", c.BatchSize)
	if c.BatchSize > 10000 {
		ck.Failf("CONSUME_BATCH_SIZE must be at most 10000 (got %d)", c.BatchSize)
	}
	c.Owned = nil
	if strings.TrimSpace(c.ShardsOwned) != "" {
		owned, err := parseShardSet(c.ShardsOwned, c.Shards)
		switch {
		case c.Shards == 0:
			ck.Failf("CONSUME_SHARDS_OWNED needs OUTBOX_SHARDS > 0")
		case err != nil:
			ck.Failf("CONSUME_SHARDS_OWNED: %v", err)
		default:
			c.Owned = owned
		}
	}
	return ck.Err()
}

// parseShardSet reads "0-3,7" into shard numbers, each below shards.
func parseShardSet(s string, shards int) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(strings.TrimSpace(lo))
		if err != nil {
			return nil, fmt.Errorf("%q is not a shard number or range", part)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(strings.TrimSpace(hi)); err != nil || b < a {
				return nil, fmt.Errorf("%q is not a shard range", part)
			}
		}
		if a < 0 || b >= shards {
			return nil, fmt.Errorf("%q is outside 0–%d", part, shards-1)
		}
		for i := a; i <= b; i++ {
			out = append(out, i)
		}
	}
	return out, nil
}

func validConsumerName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// Prune configures `console prune`.
type Prune struct {
	Common
	OutboxRetention time.Duration
	InboxRetention  time.Duration
	BatchSize       int
}

// Register adds the pruning flags.
func (c *Prune) Register(f *Flags) {
	c.Common.register(f)
	f.Duration(&c.OutboxRetention, "outbox-retention", "OUTBOX_RETENTION", outbox.DefaultRetention, "keep published outbox events this long")
	f.Duration(&c.InboxRetention, "inbox-retention", "INBOX_RETENTION", inbox.DefaultRetention, "keep processed inbox message ids this long (must exceed the longest redelivery delay)")
	f.Int(&c.BatchSize, "batch-size", "PRUNE_BATCH_SIZE", db.DefaultDeleteBatch, fmt.Sprintf("rows deleted per statement (at most %d)", db.MaxDeleteBatch))
}

// Validate checks the pruning settings.
func (c *Prune) Validate() error {
	var ck Check
	c.Common.check(&ck)
	ck.PositiveDuration("OUTBOX_RETENTION", c.OutboxRetention)
	ck.PositiveDuration("INBOX_RETENTION", c.InboxRetention)
	ck.Positive("PRUNE_BATCH_SIZE", c.BatchSize)
	if c.BatchSize > db.MaxDeleteBatch {
		ck.Failf("PRUNE_BATCH_SIZE must be at most %d (got %d)", db.MaxDeleteBatch, c.BatchSize)
	}
	return ck.Err()
}
