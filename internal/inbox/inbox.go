// Package inbox makes consumers idempotent: the dedupe row and the effect
// commit in one transaction, so a redelivered message changes nothing.
package inbox

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/db"
)

// Result says what Handle did with a message.
type Result int

const (
	Applied   Result = iota // the effect ran and committed
	Duplicate               // seen before: the effect did not run
	Stale                   // older than what was applied for its aggregate: the effect did not run
)

func (r Result) String() string {
	switch r {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case Stale:
		return "stale"
	}
	return fmt.Sprintf("Result(%d)", int(r))
}

// counterShards spreads one consumer's processed count over this many rows.
const counterShards = 16

// Inbox deduplicates messages per consumer.
type Inbox struct {
	pool *pgxpool.Pool
	m    *metrics
	log  *slog.Logger
}

// Option configures an Inbox.
type Option func(*Inbox) error

// WithMetrics registers the inbox's collectors on reg (never the default
// registry). Several inboxes in one process share them.
func WithMetrics(reg prometheus.Registerer) Option {
	return func(in *Inbox) error {
		m, err := newMetrics(reg)
		if err != nil {
			return err
		}
		in.m = m
		return nil
	}
}

// WithLogger sets the logger.
func WithLogger(log *slog.Logger) Option {
	return func(in *Inbox) error { in.log = log; return nil }
}

// New returns an Inbox over pool. Options that fail (a metric name clash)
// panic: they are wiring mistakes found at start-up; use Open to get the error.
func New(pool *pgxpool.Pool, opts ...Option) *Inbox {
	in, err := Open(pool, opts...)
	if err != nil {
		panic(err)
	}
	return in
}

// Open is New returning option errors.
func Open(pool *pgxpool.Pool, opts ...Option) (*Inbox, error) {
	in := &Inbox{pool: pool, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		if err := o(in); err != nil {
			return nil, fmt.Errorf("inbox: %w", err)
		}
	}
	if in.m == nil {
		m, err := newMetrics(nil)
		if err != nil {
			return nil, err
		}
		in.m = m
	}
	return in, nil
}

// ErrInvalid reports a call without a consumer or message id.
var ErrInvalid = errors.New("inbox: consumer and message id are required")

// Handle runs effect for (consumer, msgID) at most once: the inbox row and
// whatever effect writes in tx commit together. A duplicate returns
// Duplicate without running effect. If effect fails, nothing is recorded and
// the message may be delivered again.
func (in *Inbox) Handle(ctx context.Context, consumer, msgID string, effect func(tx pgx.Tx) error) (Result, error) {
	return in.handle(ctx, consumer, msgID, nil, effect)
}

// Version places a message in its aggregate's sequence.
type Version struct {
	AggregateType string
	AggregateID   string
	Seq           int64 // 1-based, increasing per aggregate
}

// HandleVersioned is Handle for events that carry a per-aggregate sequence
// (seed 000): besides deduplicating by message id, it drops a message whose
// sequence is not above the highest one already applied for its aggregate —
// a late redelivery or an old event retried after newer ones went through —
// and returns Stale without running effect. The message id is still
// recorded, so its redeliveries are duplicates. Gaps are allowed: seq 3 may
// follow seq 1, after which seq 2 is stale.
func (in *Inbox) HandleVersioned(ctx context.Context, consumer, msgID string, v Version, effect func(tx pgx.Tx) error) (Result, error) {
	if v.AggregateType == "" || v.AggregateID == "" || v.Seq <= 0 {
		return 0, fmt.Errorf("inbox: versioned message %s needs aggregate type, id and a positive sequence", msgID)
	}
	return in.handle(ctx, consumer, msgID, &v, effect)
}

func (in *Inbox) handle(ctx context.Context, consumer, msgID string, v *Version, effect func(tx pgx.Tx) error) (Result, error) {
	if consumer == "" || msgID == "" {
		return 0, ErrInvalid
	}
	res := Applied
	err := db.WithTx(ctx, in.pool, func(tx pgx.Tx) error {
		// A concurrent delivery of the same id waits here on the primary key
		// until the first commits (then conflicts) or rolls back (then inserts).
		tag, err := tx.Exec(ctx, `INSERT INTO inbox_message (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, consumer, msgID)
		if err != nil {
			return fmt.Errorf("inbox: record %s: %w", msgID, err)
		}
		if tag.RowsAffected() == 0 {
			res = Duplicate
			_, err := tx.Exec(ctx, `
				INSERT INTO inbox_consumer (consumer, duplicates) VALUES ($1, 1)
				ON CONFLICT (consumer) DO UPDATE SET duplicates = inbox_consumer.duplicates + 1, updated_at = now()`, consumer)
			return err
		}
		if v != nil {
			// Raise the aggregate's high-water mark only upwards; no row
			// returned means an equal or newer sequence was already applied.
			var seq int64
			err := tx.QueryRow(ctx, `
				INSERT INTO inbox_aggregate_version (consumer, aggregate_type, aggregate_id, last_seq)
				VALUES ($1, $2, $3, $4)
				ON CONFLICT (consumer, aggregate_type, aggregate_id)
				DO UPDATE SET last_seq = EXCLUDED.last_seq
				      WHERE inbox_aggregate_version.last_seq < EXCLUDED.last_seq
				RETURNING last_seq`, consumer, v.AggregateType, v.AggregateID, v.Seq).Scan(&seq)
			if errors.Is(err, pgx.ErrNoRows) {
				res = Stale
				_, err := tx.Exec(ctx, `
					INSERT INTO inbox_consumer (consumer, stale) VALUES ($1, 1)
					ON CONFLICT (consumer) DO UPDATE SET stale = inbox_consumer.stale + 1, updated_at = now()`, consumer)
				return err
			}
			if err != nil {
				return fmt.Errorf("inbox: version of %s: %w", msgID, err)
			}
		}
		if err := effect(tx); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `
			INSERT INTO inbox_consumer_shard (consumer, shard, processed, applied_at) VALUES ($1, $2, 1, now())
			ON CONFLICT (consumer, shard) DO UPDATE SET processed = inbox_consumer_shard.processed + 1,
			                                            applied_at = EXCLUDED.applied_at`,
			consumer, shardOf(msgID))
		return err
	})
	if err != nil {
		return 0, err
	}
	switch res {
	case Applied:
		in.m.processed.WithLabelValues(consumer).Inc()
	case Duplicate:
		in.m.duplicates.WithLabelValues(consumer).Inc()
	case Stale:
		in.m.stale.WithLabelValues(consumer).Inc()
		in.log.Info("inbox: stale message dropped", "consumer", consumer, "message_id", msgID)
	}
	return res, nil
}

func shardOf(msgID string) int16 {
	h := fnv.New32a()
	h.Write([]byte(msgID))
	return int16(h.Sum32() % counterShards)
}

// Stats lists every consumer's counts, by name (see ConsumersRead).
func (in *Inbox) Stats(ctx context.Context) ([]ConsumerStats, error) {
	return Stats(ctx, in.pool)
}
