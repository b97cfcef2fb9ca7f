package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/db"
)

// BatchEffect applies the messages of a batch that are neither duplicates
// nor stale, in the batch's order, inside the batch's transaction.
type BatchEffect func(ctx context.Context, tx pgx.Tx, msgs []broker.Message) error

// EachEffect runs a per-message Effect over a batch, in order.
func EachEffect(effect Effect) BatchEffect {
	return func(ctx context.Context, tx pgx.Tx, msgs []broker.Message) error {
		for _, m := range msgs {
			if err := effect(ctx, tx, m); err != nil {
				return err
			}
		}
		return nil
	}
}

// RecordBatchEffect is RecordEffect for a whole batch: the same
// consume_effect rows, written by one statement.
func RecordBatchEffect(consumer string) BatchEffect {
	return func(ctx context.Context, tx pgx.Tx, msgs []broker.Message) error {
		if len(msgs) == 0 {
			return nil
		}
		var ids, topics, types, aggTypes, aggIDs []string
		var seqs []int64
		for _, m := range msgs {
			ids = append(ids, m.ID)
			topics = append(topics, m.Topic)
			types = append(types, m.EventType)
			aggTypes = append(aggTypes, m.AggregateType)
			aggIDs = append(aggIDs, m.AggregateID)
			seqs = append(seqs, m.AggregateSeq)
		}
		_, err := tx.Exec(ctx, `
			INSERT INTO consume_effect (consumer, event_id, topic, event_type, aggregate_type, aggregate_id, aggregate_seq)
			SELECT @consumer, e.id, e.topic, e.event_type, e.aggregate_type, e.aggregate_id, e.seq
			  FROM unnest(@ids::text[], @topics::text[], @types::text[], @agg_types::text[], @agg_ids::text[], @seqs::bigint[])
			       WITH ORDINALITY AS e(id, topic, event_type, aggregate_type, aggregate_id, seq, n)
			 ORDER BY e.n`,
			pgx.NamedArgs{"consumer": consumer, "ids": ids, "topics": topics, "types": types,
				"agg_types": aggTypes, "agg_ids": aggIDs, "seqs": seqs})
		if err != nil {
			return fmt.Errorf("record effect of %d events: %w", len(msgs), err)
		}
		return nil
	}
}

// BatchCounts say what HandleBatch did with a batch's messages.
type BatchCounts struct{ Applied, Duplicates, Stale int }

// ShardPosition is where a shard's reader stands: the broker position
// (broker.Message.Position) of the last message it committed, and the
// epoch that position counts in (broker.Message.Epoch).
type ShardPosition struct {
	Shards, Shard int
	At            uint64
	Epoch         string
}

// ErrShardTaken reports a batch whose shard position moved since its reader
// started: another reader owns the shard now. Nothing of the batch was
// committed; the reader must stop.
var ErrShardTaken = errors.New("inbox: the shard's position moved: another reader has taken the shard")

// HandleBatch applies one shard's batch, in order, in one transaction: an
// inbox row per new message id, effect over the messages that are neither
// duplicates (seen before, or earlier in the same batch) nor stale (a
// sequence not above the highest already applied for their aggregate,
// counting the batch's own earlier messages), the counters, and — when pos
// is given and the messages carry broker positions — the shard's new
// position and its epoch, moved only from pos.At and pos.Epoch
// (compare-and-set; ErrShardTaken otherwise). Either all of it commits or
// none of it does, so a failed batch can be read again whole. On success
// pos is the batch's last position.
func (in *Inbox) HandleBatch(ctx context.Context, consumer string, pos *ShardPosition, msgs []broker.Message, effect BatchEffect) (BatchCounts, error) {
	if consumer == "" {
		return BatchCounts{}, ErrInvalid
	}
	for _, m := range msgs {
		if m.ID == "" {
			return BatchCounts{}, ErrInvalid
		}
	}
	var newPos ShardPosition
	if pos != nil && len(msgs) > 0 {
		last := msgs[len(msgs)-1]
		newPos = ShardPosition{Shards: pos.Shards, Shard: pos.Shard, At: last.Position, Epoch: last.Epoch}
	}
	// A replay an operator sent to another consumer is not ours to apply
	// (on NATS every consumer's shard reader receives it); the position
	// still moves past it with the batch.
	if slices.ContainsFunc(msgs, func(m broker.Message) bool { return m.ReplayTo != "" && m.ReplayTo != consumer }) {
		msgs = slices.DeleteFunc(slices.Clone(msgs), func(m broker.Message) bool { return m.ReplayTo != "" && m.ReplayTo != consumer })
	}
	counts, err := db.WithTxV(ctx, in.pool, func(tx pgx.Tx) (BatchCounts, error) {
		return in.handleBatchTx(ctx, tx, consumer, pos, newPos, msgs, effect)
	})
	if err != nil {
		return BatchCounts{}, err
	}
	if pos != nil && newPos.At > 0 {
		*pos = newPos
	}
	if counts.Applied > 0 {
		in.m.processed.WithLabelValues(consumer).Add(float64(counts.Applied))
	}
	if counts.Duplicates > 0 {
		in.m.duplicates.WithLabelValues(consumer).Add(float64(counts.Duplicates))
	}
	if counts.Stale > 0 {
		in.m.stale.WithLabelValues(consumer).Add(float64(counts.Stale))
		in.log.Info("inbox: stale messages dropped", "consumer", consumer, "count", counts.Stale)
	}
	return counts, nil
}

type aggKey struct{ typ, id string }

func (in *Inbox) handleBatchTx(ctx context.Context, tx pgx.Tx, consumer string, pos *ShardPosition, newPos ShardPosition, msgs []broker.Message, effect BatchEffect) (BatchCounts, error) {
	var c BatchCounts
	// Duplicates inside the batch (a relay's republish that JetStream's
	// window let through lands right behind the first copy).
	seen := make(map[string]bool, len(msgs))
	ids := make([]string, 0, len(msgs))
	for _, m := range msgs {
		if !seen[m.ID] {
			seen[m.ID] = true
			ids = append(ids, m.ID)
		}
	}
	fresh := make(map[string]bool, len(ids))
	if len(ids) > 0 {
		// A concurrent delivery of the same id (another reader of a shard
		// it has lost) waits on the primary key until that one commits.
		rows, err := tx.Query(ctx, `
			INSERT INTO inbox_message (consumer, message_id)
			SELECT $1, unnest($2::text[])
			ON CONFLICT DO NOTHING
			RETURNING message_id`, consumer, ids)
		if err != nil {
			return c, fmt.Errorf("inbox: record batch: %w", err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return c, fmt.Errorf("inbox: record batch: %w", err)
			}
			fresh[id] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return c, fmt.Errorf("inbox: record batch: %w", err)
		}
	}
	// The highest applied sequence of every aggregate the new messages
	// touch, locked, so the stale check and the raise are one step.
	last := map[aggKey]int64{}
	var aggTypes, aggIDs []string
	for _, m := range msgs {
		if !fresh[m.ID] || !versioned(m) {
			continue
		}
		k := aggKey{m.AggregateType, m.AggregateID}
		if _, ok := last[k]; !ok {
			last[k] = 0
			aggTypes = append(aggTypes, k.typ)
			aggIDs = append(aggIDs, k.id)
		}
	}
	if len(aggTypes) > 0 {
		rows, err := tx.Query(ctx, `
			SELECT v.aggregate_type, v.aggregate_id, v.last_seq
			  FROM inbox_aggregate_version v
			  JOIN unnest($2::text[], $3::text[]) AS a(t, i) ON v.aggregate_type = a.t AND v.aggregate_id = a.i
			 WHERE v.consumer = $1
			   FOR UPDATE OF v`, consumer, aggTypes, aggIDs)
		if err != nil {
			return c, fmt.Errorf("inbox: read versions: %w", err)
		}
		for rows.Next() {
			var k aggKey
			var seq int64
			if err := rows.Scan(&k.typ, &k.id, &seq); err != nil {
				rows.Close()
				return c, fmt.Errorf("inbox: read versions: %w", err)
			}
			last[k] = seq
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return c, fmt.Errorf("inbox: read versions: %w", err)
		}
	}
	applied := make([]broker.Message, 0, len(msgs))
	for _, m := range msgs {
		if !fresh[m.ID] {
			c.Duplicates++
			continue
		}
		// The first copy in the batch is the one that counts.
		delete(fresh, m.ID)
		if versioned(m) {
			k := aggKey{m.AggregateType, m.AggregateID}
			if m.AggregateSeq <= last[k] {
				c.Stale++
				continue
			}
			last[k] = m.AggregateSeq
		}
		applied = append(applied, m)
	}
	if len(aggTypes) > 0 {
		seqs := make([]int64, len(aggTypes))
		for i := range aggTypes {
			seqs[i] = last[aggKey{aggTypes[i], aggIDs[i]}]
		}
		_, err := tx.Exec(ctx, `
			INSERT INTO inbox_aggregate_version (consumer, aggregate_type, aggregate_id, last_seq)
			SELECT $1, a.t, a.i, a.s FROM unnest($2::text[], $3::text[], $4::bigint[]) AS a(t, i, s)
			 WHERE a.s > 0
			ON CONFLICT (consumer, aggregate_type, aggregate_id)
			DO UPDATE SET last_seq = greatest(inbox_aggregate_version.last_seq, EXCLUDED.last_seq)`,
			consumer, aggTypes, aggIDs, seqs)
		if err != nil {
			return c, fmt.Errorf("inbox: raise versions: %w", err)
		}
	}
	if len(applied) > 0 {
		if err := effect(ctx, tx, applied); err != nil {
			return c, err
		}
		shard := shardOf(applied[0].ID)
		if pos != nil {
			shard = int16(pos.Shard % counterShards)
		}
		_, err := tx.Exec(ctx, `
			INSERT INTO inbox_consumer_shard (consumer, shard, processed, applied_at) VALUES ($1, $2, $3, now())
			ON CONFLICT (consumer, shard) DO UPDATE SET processed = inbox_consumer_shard.processed + EXCLUDED.processed,
			                                            applied_at = EXCLUDED.applied_at`,
			consumer, shard, len(applied))
		if err != nil {
			return c, fmt.Errorf("inbox: count processed: %w", err)
		}
	}
	c.Applied = len(applied)
	if c.Duplicates > 0 || c.Stale > 0 {
		_, err := tx.Exec(ctx, `
			INSERT INTO inbox_consumer (consumer, duplicates, stale) VALUES ($1, $2, $3)
			ON CONFLICT (consumer) DO UPDATE SET duplicates = inbox_consumer.duplicates + EXCLUDED.duplicates,
			                                     stale = inbox_consumer.stale + EXCLUDED.stale, updated_at = now()`,
			consumer, c.Duplicates, c.Stale)
		if err != nil {
			return c, fmt.Errorf("inbox: count duplicates: %w", err)
		}
	}
	if pos != nil && newPos.At > 0 {
		// A new epoch may bring the position down (the stream counts from
		// 1 again); within one it only moves forward.
		tag, err := tx.Exec(ctx, `
			UPDATE inbox_shard_position SET position = $6, epoch = $7, updated_at = now()
			 WHERE consumer = $1 AND shards = $2 AND shard = $3 AND position = $4 AND epoch = $5`,
			consumer, pos.Shards, pos.Shard, int64(pos.At), pos.Epoch, int64(newPos.At), newPos.Epoch)
		if err != nil {
			return c, fmt.Errorf("inbox: move shard position: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return c, ErrShardTaken
		}
	}
	return c, nil
}

func versioned(m broker.Message) bool {
	return m.AggregateSeq > 0 && m.AggregateType != "" && m.AggregateID != ""
}

// ReadShardPosition returns where consumer's shard stands (creating its row
// at 0 the first time).
func (in *Inbox) ReadShardPosition(ctx context.Context, consumer string, shards, shard int) (ShardPosition, error) {
	p := ShardPosition{Shards: shards, Shard: shard}
	var at int64
	err := db.WithTx(ctx, in.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `
			INSERT INTO inbox_shard_position (consumer, shards, shard) VALUES ($1, $2, $3)
			ON CONFLICT DO NOTHING`, consumer, shards, shard); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT position, epoch FROM inbox_shard_position WHERE consumer = $1 AND shards = $2 AND shard = $3`,
			consumer, shards, shard).Scan(&at, &p.Epoch)
	})
	if err != nil {
		return p, fmt.Errorf("inbox: read position of shard %d/%d: %w", shard, shards, err)
	}
	p.At = uint64(at)
	return p, nil
}
