package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/internal/broker"
)

// DefaultConsumeBatch is how many messages of a shard one transaction
// applies at most.
const DefaultConsumeBatch = 500

// ShardedConsumer is the consumer that keeps up with the relay: the relay
// publishes each event on the shard of its aggregate (RelayConfig.Shards),
// and this consumer reads every shard it holds in order, in batches, each
// batch applied in one transaction with the shard's new position (see
// HandleBatch). Shards run in parallel, so per-aggregate order is kept
// while throughput grows with the shard count.
//
// Exclusivity: a process holds a shard through a PostgreSQL session
// advisory lock on one connection of its own. Several processes may run
// with overlapping Owned sets: each shard runs in exactly one of them, and
// when a process dies its connection closes, its locks go, and the others
// take its shards within RetryInterval, resuming from the committed
// positions. The compare-and-set on the position is the safety net: even
// two readers of one shard can never both advance it.
type ShardedConsumer struct {
	Inbox  *Inbox
	Name   string      // inbox consumer name (positions and dedupe are per name)
	Shards int         // the relays' shard count
	Owned  []int       // shards this process may run (nil: all)
	Batch  int         // most messages per transaction (default DefaultConsumeBatch)
	Effect BatchEffect // nil: RecordBatchEffect(Name)
	// Tracing (nil: none) makes one consumer span per message of a batch,
	// each the child of the context its message carries, ended when the
	// batch's transaction has committed (or failed).
	Tracing trace.TracerProvider
	// RetryInterval is how often the consumer tries to take the owned
	// shards it does not hold, and checks its lock connection (default 2s).
	RetryInterval time.Duration
	// ReportInterval is how often Run reports the process, its shard count
	// and the shards it holds, in inbox_consumer_process for the console
	// (default DefaultReportInterval; at once when it takes or loses one).
	ReportInterval time.Duration

	applied, duplicates, stale, batches atomic.Int64
	act                                 activity
	running                             atomic.Int64
}

// Counts returns the running totals.
func (c *ShardedConsumer) Counts() ConsumerCounts {
	return ConsumerCounts{Applied: c.applied.Load(), Duplicates: c.duplicates.Load(), Stale: c.stale.Load()}
}

// Running is how many shards this process runs now.
func (c *ShardedConsumer) Running() int { return int(c.running.Load()) }

func (c *ShardedConsumer) owned() ([]int, error) {
	if c.Shards < 1 || c.Shards > broker.MaxShards {
		return nil, fmt.Errorf("inbox: shard count %d must be 1–%d", c.Shards, broker.MaxShards)
	}
	if c.Owned == nil {
		all := make([]int, c.Shards)
		for i := range all {
			all[i] = i
		}
		return all, nil
	}
	seen := map[int]bool{}
	var out []int
	for _, s := range c.Owned {
		if s < 0 || s >= c.Shards {
			return nil, fmt.Errorf("inbox: owned shard %d is not in 0–%d", s, c.Shards-1)
		}
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("inbox: no shard owned")
	}
	return out, nil
}

// lockKey is the advisory lock of one shard of this consumer: the class is
// a hash of the consumer name and shard count, the object the shard.
const lockSQL = `SELECT pg_try_advisory_lock(hashtext('sluice.inbox.shard:' || $1 || ':' || $2::int::text), $3)`
const unlockSQL = `SELECT pg_advisory_unlock(hashtext('sluice.inbox.shard:' || $1 || ':' || $2::int::text), $3)`

// Run holds and runs shards until ctx ends (then nil). It returns an error
// only for a wiring mistake (bad shard set, no database at start).
func (c *ShardedConsumer) Run(ctx context.Context, sub broker.ShardSubscriber) (err error) {
	owned, err := c.owned()
	if err != nil {
		return err
	}
	if err := broker.ValidateConsumer(c.Name); err != nil {
		return err
	}
	retry := c.RetryInterval
	if retry <= 0 {
		retry = 2 * time.Second
	}
	// Brokers whose publishes need a queue to exist (RabbitMQ's mandatory
	// publishes) get every shard's queue now, owned or not, so no shard's
	// events are refused while nobody runs it.
	if d, ok := sub.(interface {
		DeclareShardQueues(consumer string, shards int) error
	}); ok {
		if err := d.DeclareShardQueues(c.Name, c.Shards); err != nil {
			return fmt.Errorf("inbox: declare shard queues: %w", err)
		}
	}
	report := newPresence(c.Inbox, c.Name, c.Shards, c.Owned, c.ReportInterval, &c.applied, &c.act)
	stopReport := report.start(ctx)
	defer func() { stopReport(err == nil || ctx.Err() != nil) }()
	var (
		lockConn *pgxpool.Conn
		wg       sync.WaitGroup
		mu       sync.Mutex
		held     = map[int]context.CancelFunc{}
		ended    = make(chan int, len(owned))
		// releasing are held shards being given up for a peer below its
		// share (stopping; unlocked when they end); seenFree are shards
		// found free while at our share, left to the others once.
		releasing = map[int]bool{}
		seenFree  = map[int]bool{}
		// yielded are shards just given up for a peer: left free for one
		// try even when this process is below its share (a process at its
		// share gives one to a limited peer, forRestricted), so that it
		// does not take the shard straight back before the peer can.
		yielded = map[int]bool{}
		// peersFailing: the last read of the peers' reports failed (logged
		// once per run of failures).
		peersFailing bool
	)
	heldGauge := c.Inbox.m.shardsHeld.WithLabelValues(c.Name)
	defer heldGauge.Set(0)
	heldNow := func() {
		mu.Lock()
		hs := make([]int, 0, len(held))
		for s := range held {
			hs = append(hs, s)
		}
		mu.Unlock()
		heldGauge.Set(float64(len(hs)))
		report.setHeld(hs)
	}
	stopAll := func() {
		mu.Lock()
		for _, cancel := range held {
			cancel()
		}
		mu.Unlock()
		wg.Wait()
		// Drain the ends of what was stopped.
		for {
			select {
			case <-ended:
			default:
				mu.Lock()
				clear(held)
				mu.Unlock()
				clear(releasing)
				heldNow()
				return
			}
		}
	}
	dropConn := func() {
		if lockConn != nil {
			// Closing the session releases every advisory lock it holds.
			_ = lockConn.Conn().Close(context.WithoutCancel(ctx))
			lockConn.Release()
			lockConn = nil
		}
	}
	defer func() {
		stopAll()
		dropConn()
	}()
	log := c.Inbox.log.With("consumer", c.Name, "shards", c.Shards)
	tick := time.NewTicker(retry)
	defer tick.Stop()
	first := true
	for {
		if !first {
			select {
			case <-ctx.Done():
				return nil
			case s := <-ended:
				mu.Lock()
				delete(held, s)
				mu.Unlock()
				if releasing[s] {
					yielded[s] = true
				}
				delete(releasing, s)
				heldNow()
				if lockConn != nil {
					uctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					if _, err := lockConn.Exec(uctx, unlockSQL, c.Name, c.Shards, s); err != nil {
						log.Warn("inbox: unlock shard", "shard", s, "err", err)
					}
					cancel()
				}
				continue
			case <-tick.C:
			}
		}
		first = false
		if lockConn != nil {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := lockConn.Ping(pctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				// The locks died with the session: whoever takes the
				// shards now resumes from the committed positions, and
				// our readers' next commits would fail the position check.
				log.Warn("inbox: lock connection lost; stopping every shard", "err", err)
				stopAll()
				dropConn()
			}
		}
		if lockConn == nil {
			lc, err := c.Inbox.pool.Acquire(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				log.Warn("inbox: no lock connection; retrying", "err", err)
				continue
			}
			lockConn = lc
		}
		// Share the shards with the other running processes of this
		// consumer and shard count (their reports): give up what is above
		// our share to a peer below its own, and take a free shard beyond
		// our share only when it is still free at the next try (a peer
		// below its share takes it first). Without peers' reports (none
		// yet, or the read failed) every free shard is taken, as before.
		peers, err := report.peers(ctx)
		switch {
		case err != nil && ctx.Err() == nil && !peersFailing:
			log.Warn("inbox: cannot read the other processes' reports; taking every free shard until it can", "err", err)
			peersFailing = true
		case err == nil && peersFailing:
			log.Info("inbox: reads the other processes' reports again; sharing shards")
			peersFailing = false
		}
		fair := c.Shards
		if len(peers) > 0 {
			fair = fairShare(c.Shards, len(peers)+1)
		}
		mu.Lock()
		var keep []int
		for s := range held {
			if !releasing[s] {
				keep = append(keep, s)
			}
		}
		for _, s := range toRelease(keep, fair, peers) {
			log.Info("inbox: giving a shard up to a process below its share", "shard", s, "share", fair)
			releasing[s] = true
			held[s]()
		}
		keeping := len(held) - len(releasing)
		mu.Unlock()
		for _, s := range owned {
			mu.Lock()
			_, running := held[s]
			mu.Unlock()
			if running {
				continue
			}
			var got bool
			lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := lockConn.QueryRow(lctx, lockSQL, c.Name, c.Shards, s).Scan(&got)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				log.Warn("inbox: lock shard", "shard", s, "err", err)
				break
			}
			if !got {
				delete(seenFree, s)
				delete(yielded, s)
				continue
			}
			if (keeping >= fair || yielded[s]) && !seenFree[s] {
				seenFree[s] = true
				delete(yielded, s)
				uctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := lockConn.Exec(uctx, unlockSQL, c.Name, c.Shards, s)
				cancel()
				if err != nil {
					log.Warn("inbox: unlock shard", "shard", s, "err", err)
				}
				continue
			}
			delete(seenFree, s)
			keeping++
			sctx, cancel := context.WithCancel(ctx)
			mu.Lock()
			held[s] = cancel
			mu.Unlock()
			wg.Add(1)
			c.running.Add(1)
			go func() {
				defer wg.Done()
				defer c.running.Add(-1)
				c.runShard(sctx, sub, s)
				cancel()
				ended <- s
			}()
		}
		heldNow()
	}
}

// runShard reads one shard until ctx ends or another reader takes it,
// starting again from the committed position after any failure.
func (c *ShardedConsumer) runShard(ctx context.Context, sub broker.ShardSubscriber, shard int) {
	log := c.Inbox.log.With("consumer", c.Name, "shard", shard, "shards", c.Shards)
	effect := c.Effect
	if effect == nil {
		effect = RecordBatchEffect(c.Name)
	}
	size := c.Batch
	if size <= 0 {
		size = DefaultConsumeBatch
	}
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		pos, err := c.Inbox.ReadShardPosition(ctx, c.Name, c.Shards, shard)
		if err == nil {
			log.Debug("inbox: shard started", "after", pos.At, "epoch", pos.Epoch)
			err = sub.SubscribeShard(ctx, broker.ShardSubscription{
				Consumer: c.Name, Shards: c.Shards, Shard: shard, Batch: size, After: pos.At, Epoch: pos.Epoch,
			}, func(ctx context.Context, batch []broker.Message) error {
				spans := c.startSpans(ctx, batch)
				n, err := c.Inbox.HandleBatch(ctx, c.Name, &pos, batch, effect)
				endSpans(spans, err)
				if err != nil {
					return err
				}
				c.batches.Add(1)
				if n.Applied > 0 {
					c.act.didApply()
				}
				c.applied.Add(int64(n.Applied))
				c.duplicates.Add(int64(n.Duplicates))
				c.stale.Add(int64(n.Stale))
				wait = 100 * time.Millisecond
				return nil
			})
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrShardTaken) {
			log.Warn("inbox: shard taken by another reader; letting it go")
			return
		}
		if err == nil {
			err = errors.New("subscription ended")
		}
		c.act.didFail()
		// Head-of-line: the batch is read again from the committed
		// position, in order, after a growing pause.
		log.Warn("inbox: shard batch failed; reading it again", "retry_in", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// startSpans starts a span per message when tracing is on (nil otherwise).
func (c *ShardedConsumer) startSpans(ctx context.Context, batch []broker.Message) []trace.Span {
	if c.Tracing == nil {
		return nil
	}
	spans := make([]trace.Span, len(batch))
	for i, m := range batch {
		_, spans[i] = startHandleSpan(ctx, c.Tracing, c.Name, m)
		spans[i].SetAttributes(attribute.Int("messaging.batch.message_count", len(batch)))
	}
	return spans
}

func endSpans(spans []trace.Span, err error) {
	for _, s := range spans {
		if err != nil {
			s.RecordError(err)
			s.SetStatus(codes.Error, "batch failed")
		}
		s.End()
	}
}
