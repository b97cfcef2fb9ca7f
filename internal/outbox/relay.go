package outbox

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/telemetry"
)

// Publisher is what the relay needs from a broker.
type Publisher interface {
	Publish(ctx context.Context, msg broker.Message) error
}

// RelayConfig tunes a Relay. The zero value of every field is its default.
type RelayConfig struct {
	Name               string        // for logs (default "relay")
	BatchSize          int           // events claimed per statement (default DefaultBatchSize)
	Lease              time.Duration // how long a claim is held before another relay may take over (default 30s)
	PollInterval       time.Duration // longest sleep between claims when idle (default 1s)
	MaxAttempts        int           // failed attempts before an event goes dead (default 10)
	Backoff            Backoff       // delay after a failed attempt
	DisableOrdering    bool          // true: do not hold an event back behind an earlier pending or dead event of its aggregate
	PublishConcurrency int           // aggregates published in parallel within a batch (default 8)
	PublishTimeout     time.Duration // per publish; at most Lease/2, else Lease/3 (the default)
	DisableListen      bool          // true: poll only, no LISTEN wake-up
	// OutagePauseCap is the longest Run pauses between two claims while the
	// broker cannot be reached (default DefaultOutagePauseCap, never above
	// Backoff.Cap): how long after the broker is back it may take to notice.
	OutagePauseCap time.Duration
	// ReportInterval is how often Run reports the relay in outbox_relay for
	// the console (default DefaultReportInterval); the console shows a
	// relay as silent after three intervals without a report.
	ReportInterval time.Duration
	// Shards > 0 publishes each event on the shard of its aggregate
	// (broker.ShardOf), so consumers can read shards in parallel and still
	// see each aggregate in order; consumers must use the same count. 0:
	// unsharded subjects, as before sharding existed.
	Shards int
	// Now is the relay's clock. Nil means the database clock
	// (statement_timestamp()), so relays on hosts with skewed clocks agree on
	// leases; tests inject a clock so leases and backoff expire without sleeping.
	Now func() time.Time
	// Tracing (nil: none) makes one producer span per publish, child of
	// the trace context the event's headers carry (telemetry.Inject at
	// Insert), and hands the broker that span's context instead.
	Tracing trace.TracerProvider
}

func (c RelayConfig) withDefaults() RelayConfig {
	if c.Name == "" {
		c.Name = "relay"
	}
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.Lease <= 0 {
		c.Lease = DefaultLease
	}
	if c.PollInterval <= 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	c.Backoff = c.Backoff.withDefaults()
	if c.PublishConcurrency <= 0 {
		c.PublishConcurrency = DefaultPublishConcurrency
	}
	if c.OutagePauseCap <= 0 {
		c.OutagePauseCap = DefaultOutagePauseCap
	}
	c.OutagePauseCap = min(c.OutagePauseCap, c.Backoff.Cap)
	if c.ReportInterval <= 0 {
		c.ReportInterval = DefaultReportInterval
	}
	if c.PublishTimeout <= 0 || c.PublishTimeout > c.Lease/2 {
		c.PublishTimeout = c.Lease / 3
	}
	return c
}

// Relay moves committed outbox events to the broker, at least once:
// claim a batch under a lease (one statement), publish outside any
// transaction, then mark published only where the lease token is still ours.
// Run as many relays as you like, on as many hosts as you like.
type Relay struct {
	pool *pgxpool.Pool
	pub  Publisher
	cfg  RelayConfig
	log  *slog.Logger
	m    *metrics

	claimSQL string
	stats    relayCounters
	outage   atomic.Int64 // publishes failed in a row because the broker was unavailable
	tracer   trace.Tracer // nil: tracing off, no span work at all

	// paused: this relay's last batch met a broker outage (counted in
	// sluice_outbox_relays_broker_unavailable).
	paused atomic.Bool
	// reportNow asks Run's reporter to report at once (a pause began or
	// ended); ident is what the report says of the relay.
	reportNow chan struct{}
	ident     relayIdentity

	compacted atomic.Int64 // when compactCounts last ran (Unix ns)
	// lastPublish is when a batch was last marked published (nil: none
	// yet), for the relay's report; a time.Time keeps the monotonic clock.
	lastPublish atomic.Pointer[time.Time]
	// lastFailure is the last failed publish (nil: none yet), for the
	// relay's report.
	lastFailure atomic.Pointer[relayFailure]

	cursor claimCursor
}

// claimCursor is where the relay's claims start their walk of
// outbox_event_pending_idx. A published event leaves its entry in that
// partial index until VACUUM removes it (the mark is not a HOT update), and
// an index scan passes over every such entry, so a walk from the lowest id
// costs one step per event published since the last vacuum: at 1,000
// events/s a claim read 3 ms at the start of a 5 s run and 7 ms at its end
// (bench/README.md, change 9), and on a table whose history is
// large autovacuum comes far less often than that. So each claim starts at
// the lowest id that was pending and claimable (or leased) at the relay's
// previous claim (claimFloorSQL): every such event still pending has an id
// at least as high. Events that stay pending without being claimable —
// backing off, held behind a dead letter — do not hold the cursor back: one
// dead letter waiting days for an operator would otherwise make every claim
// walk all that was published since. What the cursor cannot see is an
// event below it that becomes claimable (a backoff over, a dead letter
// retried and its held events after it), one made pending again (an
// operator's retry or replay) or one committed late with an id made earlier
// (lateCommit covers the usual moment between the two): a claim that takes
// nothing from the cursor walks again from the lowest id, and so does one
// claim per fullWalk however busy the relay.
//
// A walk from the lowest id still passes over every entry published since
// the last vacuum, and while a snapshot stays open anywhere (a long report,
// a backup, a standby's feedback) it visits the table for each: bench R2
// with a snapshot held for 60 s saw such walks reach 200 ms. So walks from
// the lowest id — the periodic one and the one after an empty claim — are
// spaced by at least walkSpacing times the last one's length: they take at
// most about a tenth of the relay's time, however long the history, and an
// event below the cursor waits longer only while walks are that slow.
type claimCursor struct {
	mu       sync.Mutex
	from     uuid.UUID     // the lowest id pending and claimable (or leased) at the last claim (zero: unknown)
	walkedAt time.Time     // the last walk from the lowest id
	walkCost time.Duration // how long it took
	fullWalk time.Duration
}

// walkSpacing is how many times its own length a walk from the lowest id
// waits before the next one (claimCursor); walks shorter than cheapWalk are
// not spaced (only the periodic one waits, fullWalk): an idle relay woken by
// an operator's retry looks from the lowest id at once.
const (
	walkSpacing = 9
	cheapWalk   = 10 * time.Millisecond
)

// defaultFullWalk is how often a relay's claim walks the pending events from
// the lowest id (claimCursor).
const defaultFullWalk = time.Second

// lateCommit is how long before a claim an event's id may have been made
// and the claim still start below it: an event is committed a moment after
// its id is made (UUIDv7, from the writer's clock), and a claim in between
// moves the cursor past it. A claim starts no later than the ids made
// lateCommit ago; an event committed later than that after its id was made
// waits for the next full walk.
const lateCommit = 250 * time.Millisecond

// start is where the next claim starts, and whether it is a full walk.
func (c *claimCursor) start(now time.Time) (uuid.UUID, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.from == uuid.Nil || now.Sub(c.walkedAt) >= max(c.fullWalk, walkSpacing*c.walkCost) {
		return uuid.Nil, true
	}
	if late := v7Before(now.Add(-lateCommit)); bytes.Compare(late[:], c.from[:]) < 0 {
		return late, false
	}
	return c.from, false
}

// v7Before is the lowest UUIDv7 of the millisecond at: every id made at or
// after at (by a clock that agrees) is at least this.
func v7Before(at time.Time) uuid.UUID {
	var u uuid.UUID
	ms := uint64(max(at.UnixMilli(), 0))
	for i := range 6 {
		u[i] = byte(ms >> (40 - 8*i))
	}
	return u
}

// rewalk says whether a claim that took nothing from the cursor may walk
// again from the lowest id at now (walkSpacing).
func (c *claimCursor) rewalk(now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.walkCost < cheapWalk || now.Sub(c.walkedAt) >= walkSpacing*c.walkCost
}

// moved records the lowest pending id a claim read (from its start on)
// once the claim committed; nil: nothing was pending from there. walk is
// how long the read that walked took (the floor read, not the wait for the
// claim lock before it: a busy relay waits there for the other's claims,
// and spacing walks by that wait left events below the cursor for many
// seconds in bench R2 at 3,125/s).
func (c *claimCursor) moved(first *uuid.UUID, full bool, walk time.Duration, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if full {
		c.walkedAt, c.walkCost = now, walk
	}
	if first != nil && (full || bytes.Compare(first[:], c.from[:]) > 0) {
		c.from = *first
	}
}

// relayTracer is the relay's tracer, nil when tracing is off (no provider,
// or a no-op one), so publishing does no span work at all then.
func relayTracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	if _, off := tp.(noop.TracerProvider); off {
		return nil
	}
	return telemetry.Tracer(tp)
}

type relayCounters struct {
	claimed, published, failed, dead, leaseExpired, lost atomic.Int64
}

// RelayStats are a relay's running totals since it was made.
type RelayStats struct {
	Claimed      int64 // events claimed
	Published    int64 // events published and marked
	Failed       int64 // failed publish attempts
	Dead         int64 // events this relay dead-lettered
	LeaseExpired int64 // claims that took over an expired lease
	Lost         int64 // published events whose mark found another relay's token: duplicates
}

// NewRelay builds a relay publishing through pub. Metrics are registered on
// reg (nil: not exported); log may be nil.
func NewRelay(pool *pgxpool.Pool, pub Publisher, cfg RelayConfig, log *slog.Logger, reg prometheus.Registerer) (*Relay, error) {
	if pool == nil || pub == nil {
		return nil, errors.New("outbox: relay needs a pool and a publisher")
	}
	cfg = cfg.withDefaults()
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("outbox: metrics: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Relay{
		pool: pool, pub: pub, cfg: cfg, m: m,
		log:       log.With("relay", cfg.Name),
		claimSQL:  claimSQL(!cfg.DisableOrdering),
		tracer:    relayTracer(cfg.Tracing),
		cursor:    claimCursor{fullWalk: defaultFullWalk},
		reportNow: make(chan struct{}, 1),
		ident:     newRelayIdentity(),
	}, nil
}

// Config is the relay's effective configuration (defaults filled in).
func (r *Relay) Config() RelayConfig { return r.cfg }

// Paused reports whether the relay's last batch met a broker outage: it
// waits for the broker with its events untouched (the console reads the
// same from outbox_relay; the demo's status line from here).
func (r *Relay) Paused() bool { return r.paused.Load() }

// Stats returns the relay's running totals.
func (r *Relay) Stats() RelayStats {
	return RelayStats{
		Claimed: r.stats.claimed.Load(), Published: r.stats.published.Load(),
		Failed: r.stats.failed.Load(), Dead: r.stats.dead.Load(),
		LeaseExpired: r.stats.leaseExpired.Load(), Lost: r.stats.lost.Load(),
	}
}

// claimSQL is the one claiming statement. The inner SELECT walks
// outbox_event_pending_idx in its own order (ORDER BY id over the partial
// index of pending rows), so a batch reads only about the rows it takes, and
// FOR UPDATE SKIP LOCKED lets concurrent relays take disjoint batches. Under
// READ COMMITTED a row another relay claimed after our snapshot is re-checked
// against its newest version once locked, and dropped: its lease is live.
// prev_lock is the lease being replaced: non-null means an expired lease;
// every returned row carries the batch's count of those.
//
// With ordering, an event is eligible only when no earlier event of its
// aggregate is unfinished, pending or dead (outbox_event_pending_aggregate_idx
// holds exactly those rows and answers with one index probe), so a batch
// holds at most one event per aggregate, the next one is claimed only after
// this one is marked published, and a dead letter holds back only its own
// aggregate until an operator retries it (order kept) or discards it.
//
// $5 is where the walk starts (claimFloorSQL, read just before): the lowest
// id pending from the relay's cursor on (claimCursor), or, when topics are
// paused and that is higher, the lowest pending id of a topic that is not
// paused; $6 are the paused topics, whose events after it the walk passes
// over.
//
// The claim runs on its prepared statement's generic plan, made once per
// connection under the settings claimPlanSQL gives the claim's transaction,
// so it must have one plan that is right whatever the statistics say
// (TestClaimGenericPlansMadeOnAnEmptyTable): with sequential scans and sorts
// disabled, the walk can only read an index of ids in their order from $5.
// That is outbox_event_pending_idx, or the primary key when the statistics
// the plan was made from say nearly every row is pending (the two then cost
// the same); from the floor on, the primary key holds the same rows plus the
// events published since the floor's, which the floor read keeps few (about
// a batch in a steady drain). The update finds the claimed rows by their ids
// (= ANY over the claim's array: primary key probes) rather than by a join
// to the claim: on statistics that say the table is empty, a generic plan of
// the join walked the whole primary key with the claimed rows on the inner
// side.
func claimSQL(ordered bool) string {
	orderClause := ""
	if ordered {
		// OFFSET 0 keeps the check a correlated subplan: one probe of
		// outbox_event_pending_aggregate_idx by aggregate per candidate.
		// Flattened into an anti join, the planner may, when its statistics
		// still describe a nearly empty table (an outbox that filled faster
		// than autoanalyze), scan the whole index for every candidate and
		// filter by aggregate: O(pending²) per claim, seconds at a few
		// thousand pending rows (bench R2 saw 13 s p99 at 1,000 events/s).
		orderClause = `
		  AND NOT EXISTS (
		        SELECT 1 FROM outbox_event p
		         WHERE p.status IN ('pending', 'dead')
		           AND p.aggregate_type = c.aggregate_type
		           AND p.aggregate_id = c.aggregate_id
		           AND p.aggregate_seq < c.aggregate_seq
		        OFFSET 0)`
	}
	return `
	WITH claim AS (
		SELECT c.id, c.locked_until AS prev_lock
		  FROM outbox_event c
		 WHERE c.status = 'pending'
		   AND c.available_at <= coalesce($1::timestamptz, statement_timestamp())
		   AND (c.locked_until IS NULL OR c.locked_until < coalesce($1::timestamptz, statement_timestamp()))
		   AND c.id >= $5::uuid
		   AND CASE WHEN cardinality($6::text[]) = 0 THEN true ELSE c.topic <> ALL($6::text[]) END` + orderClause + `
		 ORDER BY c.id
		 LIMIT $2
		 FOR UPDATE OF c SKIP LOCKED
	)
	UPDATE outbox_event e
	   SET locked_until = coalesce($1::timestamptz, statement_timestamp()) + $3::bigint * interval '1 microsecond',
	       lock_token = $4,
	       attempts = e.attempts + 1
	 WHERE e.id = ANY (ARRAY(SELECT id FROM claim))
	RETURNING e.id, e.aggregate_type, e.aggregate_id, e.aggregate_seq, e.topic, e.event_type,
	          e.payload, e.headers, e.attempts, (SELECT count(*) FROM claim WHERE prev_lock IS NOT NULL),
	          coalesce(e.replay_to, ''), e.replay_count`
}

// claimed is one event this relay holds under its lease.
type claimed struct {
	ID            uuid.UUID
	AggregateType string
	AggregateID   string
	AggregateSeq  int64
	Topic         string
	EventType     string
	Payload       []byte
	Headers       map[string]string
	Attempts      int
	Shards, Shard int    // where it is published (Shards 0: unsharded)
	ReplayTo      string // a replay for one consumer ("" : everyone on the topic)
	Replay        int    // replays an operator asked for (0: never replayed)
}

func (c claimed) message() broker.Message {
	return broker.Message{
		ID: c.ID.String(), Topic: c.Topic,
		AggregateType: c.AggregateType, AggregateID: c.AggregateID, AggregateSeq: c.AggregateSeq,
		EventType: c.EventType, Payload: c.Payload, Headers: c.Headers,
		Shards: c.Shards, Shard: c.Shard,
		Replay: c.Replay, ReplayTo: c.ReplayTo,
	}
}

// BatchResult says what one RunOnce did.
type BatchResult struct {
	Claimed      int // events claimed
	Published    int // published and marked
	Failed       int // publish failed: backed off (or dead, counted in Dead too)
	Dead         int // dead-lettered in this batch
	Deferred     int // not attempted: an earlier event of the aggregate failed in this batch, or shutdown
	Lost         int // published, but the mark found the lease gone: another relay owns them now
	LeaseExpired int // claimed rows whose previous lease had expired
	// Unavailable counts publishes refused because the broker could not be
	// reached (broker.ErrUnavailable): given back at once with their
	// attempt, claimable again, never backed off (the relay pauses instead).
	Unavailable int
	OutageRun   int // batches in a row that met the outage (0: the broker answered)
}

// nowArg is the claim's clock: nil lets the database decide.
func (r *Relay) nowArg() *time.Time {
	if r.cfg.Now == nil {
		return nil
	}
	t := r.cfg.Now()
	return &t
}

// claimTurnSQL lets one claim run at a time among the relays of a database:
// a lock on the empty table outbox_claim_turn (migration 00024), held until
// the claim's transaction ends. Two claims that overlap meet the same rows,
// the lowest eligible ids: a claim whose snapshot was taken before the other
// committed sees the rows the other has just leased as free, locks their
// newest version (FOR UPDATE), finds the new lease on the re-check and
// passes over them, but keeps those row locks until it commits, so the relay
// that owns the rows waits for it to mark them published. Queued behind the
// lock, the next claim takes its snapshot after the previous claim
// committed and passes over the leased rows without locking them.
// Publishing and marking still run in parallel; only the claims take turns.
// Bench R1 (bench/README.md, change 7): the relays' database CPU per event
// fell by a sixth to a quarter.
//
// The wait holds no snapshot. The relay sends its next claim while the
// previous one's COMMIT is still on its way (claimStart), so the next claim
// waits for its turn from before its own last claim committed. Until 5
// December (thirteenth session) the turn was an advisory lock taken by a
// SELECT, whose snapshot's xmin held for the whole wait: the row versions
// the relay's own last claim had replaced (the leases are HOT updates)
// could not be pruned, so its marks found no room on the rows' pages and
// wrote each new version, 1 KB in full, on another page. LOCK TABLE takes
// no snapshot, and once a connection has looked the table up its name comes
// from the catalog cache without one. Bench R1 (bench/README.md, change 12):
// about 1 KB less WAL per event, all of it the marks'. Letting a relay that
// has caught up claim without its turn was measured and not kept: with slow
// commits, turns space the relays' claims evenly, and without them R2's p99
// rose (bench/README.md, "Claims without turns").
const claimTurnSQL = `LOCK TABLE outbox_claim_turn IN EXCLUSIVE MODE`

// claimPlanSQL is sent first in every claim's transaction: the floor read
// after it (claimFloorSQL) runs on its prepared statement's generic plan,
// made once per connection (the pool's statement cache) instead of planned
// on every claim. Planning it was the relay's largest cost per claim at low
// rates: 1.2 ms each under load, against 0.2 ms to run it (pg_stat_statements,
// bench R2 at 1,000 events/s on a slow machine: 1.1 s of planning in a 6 s
// run; bench/README.md, change 13).
//
// A generic plan is not remade as the table grows, and one made while the
// table looked empty (a new deployment, after a TRUNCATE) would sort the
// pending rows for the paused topics' walk, or scan the table, for as long
// as nothing invalidates it (ANALYZE; autovacuum may be off). So the plan is
// made with sequential scans and sorts disabled: the only plans left walk
// the pending rows' partial indexes in their order (outbox_event_pending_idx,
// outbox_event_pending_topic_idx) and probe outbox_event_pending_aggregate_idx
// by aggregate, whatever the statistics say
// (TestClaimGenericPlansMadeOnAnEmptyTable).
// A disabled sort the plan cannot avoid (the few paused topics' rows) adds
// its penalty to the plan's cost, which would start JIT compilation on every
// run: JIT and parallel workers are off.
//
// The claim that follows runs under the same settings, on its own generic
// plan (claimSQL), for the same reason: planning it was about a fifth of the
// relay's statement time in bench R2 (0.4-0.55 ms a claim; bench/README.md,
// change 14). The settings last until the transaction ends.
const claimPlanSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
	set_config('enable_seqscan', 'off', true), set_config('enable_sort', 'off', true),
	set_config('max_parallel_workers_per_gather', '0', true), set_config('jit', 'off', true)`

// claimStart takes up to BatchSize eligible events under a fresh lease
// token, none of a paused topic (read once per claim, just before it),
// walking the pending events from the relay's cursor (claimCursor). It is
// one transaction of three round trips: BEGIN, the claim lock and the read
// of the paused topics and the walk's start sent together; the claim; the
// commit. It returns as soon as the claimed rows are read, while the COMMIT
// is still on its way: leased (nil when nothing was claimed) then gives the
// commit's outcome, once. The relay publishes in the meantime, so an
// event's way to the broker no longer waits for the lease's flush to disk
// (1.7–2.4 ms at p50, 9–14 ms at p99 on a slow disk: bench R2).
//
// Publishing before the lease is durable keeps every guarantee: until the
// COMMIT the claim's transaction holds the rows' locks (and the claim lock),
// so no other relay can claim them, and after it the lease does; nothing is
// marked before leased says the lease committed. If the COMMIT fails (the
// server or the connection gone), the rows are pending again, unleased, and
// are published again by whoever claims them next: a duplicate, as after a
// lease lost in the middle of a batch, never a loss.
func (r *Relay) claimStart(ctx context.Context, token uuid.UUID) ([]claimed, int, <-chan error, error) {
	from, full := r.cursor.start(time.Now())
	out, expired, leased, err := r.claimFrom(ctx, token, from, full)
	if err != nil || len(out) > 0 || full || !r.cursor.rewalk(time.Now()) {
		return out, expired, leased, err
	}
	// Nothing from the cursor: look from the lowest id at once, so that a
	// claim that takes nothing has looked everywhere (an operator's retry
	// below the cursor is claimed now, not at the next full walk) — unless
	// such walks are slow enough that they must be spaced (walkSpacing).
	return r.claimFrom(ctx, token, uuid.Nil, true)
}

// claimFrom is claimStart with its walk starting at the lowest pending id
// from from on (full: from is the zero id, and the cursor may move back).
// When it claimed nothing it has committed before it returns (leased nil).
func (r *Relay) claimFrom(ctx context.Context, token, from uuid.UUID, full bool) ([]claimed, int, <-chan error, error) {
	var (
		locked       time.Time     // when the claim lock was granted
		walk         time.Duration // the floor read's walk, after it
		paused       []string
		floor, first *uuid.UUID
		handedOff    bool // the transaction's COMMIT runs in its own goroutine
	)
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(claimPlanSQL)
	b.Queue(claimTurnSQL)
	b.Queue(claimFloorSQL, pgtype.UUID{Bytes: from, Valid: true}, r.nowArg(), !r.cfg.DisableOrdering)
	br := r.pool.SendBatch(ctx, b)
	tx := br.Tx()
	_, err := br.Exec() // BEGIN
	if err == nil {
		_, err = br.Exec() // claimPlanSQL
	}
	if err == nil {
		_, err = br.Exec()
		locked = time.Now()
	}
	if err == nil {
		err = br.QueryRow().Scan(&paused, &floor, &first)
		walk = time.Since(locked)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if tx != nil {
		// A no-op once committed; otherwise it ends the transaction and
		// releases the claim lock, also when ctx is done (bounded: a server
		// that stopped answering must not hold the relay here).
		defer func() {
			if handedOff {
				return
			}
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = tx.Rollback(rctx)
		}()
	}
	if err != nil {
		return nil, 0, nil, fmt.Errorf("outbox: claim: begin, claim lock, paused topics: %w", err)
	}
	if first == nil { // nothing pending from the cursor on
		r.cursor.moved(nil, full, walk, time.Now())
		return nil, 0, nil, nil
	}
	if floor == nil {
		if len(paused) > 0 { // only paused topics have pending events
			r.cursor.moved(first, full, walk, time.Now())
			return nil, 0, nil, nil
		}
		floor = first
	} else if bytes.Compare(first[:], floor[:]) > 0 {
		floor = first
	}
	// On the generic plan prepared on this connection (claimSQL says why
	// it is safe whatever the statistics).
	rows, err := tx.Query(ctx, r.claimSQL, r.nowArg(), r.cfg.BatchSize, r.cfg.Lease.Microseconds(), token, *floor, paused)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("outbox: claim: %w", err)
	}
	defer rows.Close()
	var (
		out     []claimed
		expired int
	)
	for rows.Next() {
		if out == nil { // sized once, on the first row: an idle poll allocates nothing
			out = make([]claimed, 0, r.cfg.BatchSize)
		}
		var (
			c       claimed
			id      pgtype.UUID // read in binary whatever the pool's type map (idsOf)
			headers []byte
			leased  int64 // the batch's expired leases, on every row
		)
		if err := rows.Scan(&id, &c.AggregateType, &c.AggregateID, &c.AggregateSeq, &c.Topic, &c.EventType,
			&c.Payload, &headers, &c.Attempts, &leased, &c.ReplayTo, &c.Replay); err != nil {
			return nil, 0, nil, fmt.Errorf("outbox: claim: %w", err)
		}
		c.ID = id.Bytes
		if len(headers) > 2 {
			if err := json.Unmarshal(headers, &c.Headers); err != nil {
				// Headers are written by Insert as a string map; anything
				// else is published without them rather than blocking the row.
				r.log.Warn("outbox: unreadable headers", "id", c.ID, "err", err)
			}
		}
		expired = int(leased)
		if r.cfg.Shards > 0 {
			c.Shards, c.Shard = r.cfg.Shards, broker.ShardOf(c.AggregateType, c.AggregateID, r.cfg.Shards)
		}
		out = append(out, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, 0, nil, fmt.Errorf("outbox: claim: %w", err)
	}
	// Published in the claim's order, which is id order (an aggregate's
	// events in their sequence when ordering is off: a failure defers the
	// rest of its aggregate). The update returns its rows in the order its
	// primary key probes found them, which the plan decides (a bitmap scan
	// returns them in the table's order).
	slices.SortFunc(out, func(a, b claimed) int { return bytes.Compare(a.ID[:], b.ID[:]) })
	// The cursor moves now, before the COMMIT's answer: the next claim
	// computes its start at once, and queues behind this one's claim lock
	// anyway. Should the COMMIT fail, the events it leaves pending below the
	// cursor are found by the next walk from the lowest id (claimCursor).
	r.cursor.moved(first, full, walk, time.Now())
	if len(out) == 0 {
		if err := tx.Commit(ctx); err != nil {
			return nil, 0, nil, fmt.Errorf("outbox: claim: commit: %w", err)
		}
		return nil, 0, nil, nil
	}
	// A shutdown must not abandon a COMMIT under way (its outcome would be
	// unknown), so it gets its own bounded context, as the rollback does.
	handedOff = true
	leased := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		err := tx.Commit(cctx)
		if err != nil {
			_ = tx.Rollback(cctx) // releases the connection whatever state the COMMIT left it in
			err = fmt.Errorf("outbox: claim: commit: %w", err)
		}
		leased <- err
	}()
	return out, expired, leased, nil
}

type failure struct {
	ev  claimed
	err error
}

type outcome struct {
	mu          sync.Mutex
	published   []claimed
	failed      []failure
	deferred    []claimed // held back behind a failed earlier event of their aggregate
	interrupted []claimed // not attempted (shutdown, lease running out, broker down): released as they were
	// down is set by the first publish that met a broker outage: the rest
	// of the batch is not tried (each try would wait for its own timeout or
	// refusal to say the same thing).
	down atomic.Bool
}

// claimedBatch is one claim, waiting to be published and recorded.
type claimedBatch struct {
	token     uuid.UUID
	claimedAt time.Time
	events    []claimed
	expired   int
	err       error
	leased    <-chan error // the claim's COMMIT (claimStart); nil: nothing claimed
}

// awaitLease waits for the claim's COMMIT: nil once the lease is durable.
// Nothing about the batch may be written before (the marks and releases
// match the lease token, which only a committed claim wrote). Called once
// per batch.
func (cb claimedBatch) awaitLease() error {
	if cb.leased == nil {
		return nil
	}
	return <-cb.leased
}

// claimBatch claims one batch under a fresh lease token.
func (r *Relay) claimBatch(ctx context.Context) claimedBatch {
	token, err := uuid.NewRandom()
	if err != nil {
		return claimedBatch{err: fmt.Errorf("outbox: lock token: %w", err)}
	}
	claimedAt := time.Now()
	batch, expired, leased, err := r.claimStart(ctx, token)
	if err != nil {
		return claimedBatch{err: err}
	}
	r.stats.claimed.Add(int64(len(batch)))
	if expired > 0 {
		r.stats.leaseExpired.Add(int64(expired))
		r.m.leaseExpired.Add(float64(expired))
		r.log.Warn("outbox: took over expired leases", "count", expired)
	}
	return claimedBatch{token: token, claimedAt: claimedAt, events: batch, expired: expired, leased: leased}
}

// RunOnce claims one batch, publishes it and records the outcome. It is the
// relay's whole cycle; Run runs it in a loop, claiming the next batch while
// the current one is published.
func (r *Relay) RunOnce(ctx context.Context) (BatchResult, error) {
	return r.process(ctx, r.claimBatch(ctx))
}

// process publishes a claimed batch and records the outcome.
func (r *Relay) process(ctx context.Context, cb claimedBatch) (BatchResult, error) {
	if cb.err != nil {
		return BatchResult{}, cb.err
	}
	batch, token, claimedAt := cb.events, cb.token, cb.claimedAt
	res := BatchResult{Claimed: len(batch), LeaseExpired: cb.expired}
	if len(batch) == 0 {
		return res, nil
	}

	// Stop starting publishes once the next one could outlive the lease:
	// past that point another relay may own the rest of the batch. The
	// publishes start while the claim's COMMIT is on its way (claimStart).
	out := r.publish(ctx, batch, claimedAt.Add(r.cfg.Lease-r.cfg.PublishTimeout))
	if err := cb.awaitLease(); err != nil {
		// The claim never took effect: the events are pending and unleased,
		// and whoever claims them next publishes them again.
		r.log.Warn("outbox: the claim did not commit; its events stay pending and are published again later",
			"published_meanwhile", len(out.published), "err", err)
		return res, err
	}

	// The outcome is recorded even when ctx was cancelled (graceful stop):
	// marking what the broker already has saves a duplicate later.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var errs []error
	if n, err := r.markPublished(dctx, out.published, token); err != nil {
		errs = append(errs, err)
	} else {
		res.Published = n
		res.Lost = len(out.published) - n
		r.stats.lost.Add(int64(res.Lost))
	}
	var deferDelay time.Duration
	// A broker that cannot be reached says nothing about the events: they
	// are given back at once, attempt included, in one statement, and Run
	// pauses the relay (longer with each batch in a row that meets the
	// outage) instead of pushing the events into the future. Backing the
	// events off made a fast-failing outage (a refused connection) park a
	// whole backlog batch by batch, each with a longer wait, up to the
	// 5-minute cap: minutes after the broker was back (bench R4).
	var unavailable []failure
	failed := out.failed[:0:0]
	for _, f := range out.failed {
		if errors.Is(f.err, broker.ErrUnavailable) {
			unavailable = append(unavailable, f)
		} else {
			failed = append(failed, f)
		}
	}
	if len(unavailable) > 0 {
		// Counted even when giving them back fails: the broker is down
		// either way, and Run must pause (the events' lease then runs out).
		res.OutageRun, res.Unavailable = int(r.outage.Add(1)), len(unavailable)
		if err := r.giveBack(dctx, unavailable, token); err != nil {
			errs = append(errs, err)
		}
	}
	for _, f := range failed {
		dead, delay, lost, err := r.recordFailure(dctx, f, token)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if lost {
			res.Lost++
			continue
		}
		res.Failed++
		if dead {
			res.Dead++
		}
		deferDelay = max(deferDelay, delay)
	}
	if err := r.release(dctx, out.deferred, token, deferDelay, ""); err != nil {
		errs = append(errs, err)
	}
	if err := r.release(dctx, out.interrupted, token, 0, ""); err != nil {
		errs = append(errs, err)
	}
	res.Deferred = len(out.deferred) + len(out.interrupted)
	if res.Lost > 0 {
		r.log.Warn("outbox: lease lost before mark; another relay re-claimed these events (duplicates)", "count", res.Lost)
	}
	if res.Published > 0 || res.Dead > 0 {
		r.compactCounts(dctx)
	}
	return res, errors.Join(errs...)
}

// compactInterval is how often at most a relay compacts the backlog counts.
const compactInterval = time.Second

// compactCounts collapses the backlog count deltas (CompactBacklogCounts)
// at most once per compactInterval, after a batch that changed counts: a
// mark adds one delta row per topic and batch, producers one per insert
// statement, and the console's snapshot sums them on every tick. A failure
// is logged and left to the next turn: the counts stay exact without it.
func (r *Relay) compactCounts(ctx context.Context) {
	now := time.Now().UnixNano()
	last := r.compacted.Load()
	if now-last < int64(compactInterval) || !r.compacted.CompareAndSwap(last, now) {
		return
	}
	if _, err := CompactBacklogCounts(ctx, r.pool); err != nil {
		r.log.Warn("outbox: compact backlog counts", "err", err)
	}
}

// publish sends the batch: each aggregate's events in sequence order, one
// aggregate after another in a goroutine, several aggregates at once. After a
// failure, the aggregate's later events in this batch are not sent.
func (r *Relay) publish(ctx context.Context, batch []claimed, stopAt time.Time) *outcome {
	slices.SortFunc(batch, func(a, b claimed) int {
		return cmp.Or(cmp.Compare(a.AggregateType, b.AggregateType), cmp.Compare(a.AggregateID, b.AggregateID), cmp.Compare(a.AggregateSeq, b.AggregateSeq))
	})
	// Each aggregate's run of the sorted batch, as a view of it (capacity
	// capped, so nothing appended to a group writes into the next one).
	var groups [][]claimed
	for start, i := 0, 1; i <= len(batch); i++ {
		if i == len(batch) || batch[i].AggregateType != batch[start].AggregateType || batch[i].AggregateID != batch[start].AggregateID {
			groups = append(groups, batch[start:i:i])
			start = i
		}
	}
	out := &outcome{}
	if bp, ok := r.pub.(broker.BatchPublisher); ok {
		r.publishWaves(ctx, bp, groups, out, stopAt)
		return out
	}
	// Workers take the next group by counter, not from a channel: with
	// ordering on a batch is hundreds of one-event groups, and handing each
	// over through a channel parked and woke a goroutine per event (a fifth
	// of the relay's CPU in bench R1's profile, with the null sink).
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range min(r.cfg.PublishConcurrency, len(groups)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(groups) {
					return
				}
				r.publishGroup(ctx, groups[i], out, stopAt)
			}
		})
	}
	wg.Wait()
	return out
}

func (r *Relay) publishGroup(ctx context.Context, g []claimed, out *outcome, stopAt time.Time) {
	for i, ev := range g {
		if ctx.Err() != nil || time.Now().After(stopAt) || out.down.Load() {
			out.add(func() { out.interrupted = append(out.interrupted, g[i:]...) })
			return
		}
		pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
		start := time.Now()
		msg, span := r.startPublishSpan(pctx, ev)
		err := r.pub.Publish(pctx, msg)
		endPublishSpan(span, err)
		cancel()
		r.m.duration.Observe(time.Since(start).Seconds())
		switch {
		case err == nil:
			out.add(func() { out.published = append(out.published, ev) })
		case ctx.Err() != nil:
			// Shutdown, not the event's fault: release without an attempt.
			out.add(func() { out.interrupted = append(out.interrupted, g[i:]...) })
			return
		default:
			if errors.Is(err, broker.ErrUnavailable) {
				out.down.Store(true)
			}
			out.add(func() {
				out.failed = append(out.failed, failure{ev: ev, err: err})
				out.deferred = append(out.deferred, g[i+1:]...)
			})
			return
		}
	}
}

// publishWaves sends the batch through a BatchPublisher in waves: wave k
// holds the k-th event of every aggregate still going, all in flight at
// once, and the next wave starts after the broker acknowledged this one. An
// aggregate's events are thus never in flight together (a batch publish does
// not stop at a failure, so two of them in one wave could be stored out of
// order), and after a failure the aggregate's later events are not sent.
// With ordering on, a batch holds one event per aggregate: one wave.
func (r *Relay) publishWaves(ctx context.Context, bp broker.BatchPublisher, groups [][]claimed, out *outcome, stopAt time.Time) {
	var msgs []broker.Message
	for k := 0; len(groups) > 0; k++ {
		if ctx.Err() != nil || time.Now().After(stopAt) || out.down.Load() {
			for _, g := range groups {
				out.interrupted = append(out.interrupted, g[k:]...)
			}
			return
		}
		msgs = msgs[:0]
		pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
		var spans []trace.Span
		for _, g := range groups {
			msg, span := r.startPublishSpan(pctx, g[k])
			msgs = append(msgs, msg)
			if span != nil {
				spans = append(spans, span)
			}
		}
		start := time.Now()
		errs := bp.PublishBatch(pctx, msgs)
		cancel()
		for i, span := range spans {
			var err error
			if i < len(errs) {
				err = errs[i]
			}
			endPublishSpan(span, err)
		}
		took := time.Since(start).Seconds()
		still := groups[:0]
		for i, g := range groups {
			r.m.duration.Observe(took)
			var err error
			if i < len(errs) {
				err = errs[i]
			} else {
				err = errors.New("outbox: the broker returned no outcome for this event")
			}
			switch {
			case err == nil:
				out.published = append(out.published, g[k])
				if k+1 < len(g) {
					still = append(still, g)
				}
			case ctx.Err() != nil:
				out.interrupted = append(out.interrupted, g[k:]...)
			default:
				if errors.Is(err, broker.ErrUnavailable) {
					out.down.Store(true)
				}
				out.failed = append(out.failed, failure{ev: g[k], err: err})
				out.deferred = append(out.deferred, g[k+1:]...)
			}
		}
		groups = still
	}
}

// startPublishSpan is ev's message, and with tracing on a producer span
// (child of the trace context ev's headers carry) whose own context replaces
// that in the message's headers, so the consumer's span is the publish's
// child. Without tracing the message carries the stored headers as they are.
func (r *Relay) startPublishSpan(ctx context.Context, ev claimed) (broker.Message, trace.Span) {
	msg := ev.message()
	if r.tracer == nil {
		return msg, nil
	}
	sctx, span := r.tracer.Start(telemetry.Extract(ctx, ev.Headers), "publish "+ev.Topic,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", ev.Topic),
			attribute.String("messaging.message.id", msg.ID),
			attribute.String("sluice.event_type", ev.EventType),
			attribute.Int("sluice.attempt", ev.Attempts),
		))
	hdr := make(map[string]string, len(ev.Headers)+2)
	for k, v := range ev.Headers {
		if k != telemetry.HeaderTraceparent && k != telemetry.HeaderTracestate {
			hdr[k] = v
		}
	}
	telemetry.Inject(sctx, hdr)
	msg.Headers = hdr
	return msg, span
}

func endPublishSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "publish failed")
	}
	span.End()
}

func (o *outcome) add(f func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	f()
}

// idsOf is the events' ids as pgx's UUID codec sends them in binary. A
// uuid.UUID is a driver.Valuer, and pgx's default type map encodes it
// through that: String() into 36 characters, a failed binary encode (an
// error value formatted per id), a parse back into 16 bytes. db.OpenConfig
// teaches its pools better (db.registerTypes), but the relay takes any pool,
// and its mark and release send a whole batch of ids; in a CPU profile of
// bench R1 that path (and its mirror when scanning the claimed ids into
// uuid.UUID) was about a tenth of the relay process's CPU.
func idsOf(evs []claimed) []pgtype.UUID {
	ids := make([]pgtype.UUID, len(evs))
	for i, e := range evs {
		ids[i] = pgtype.UUID{Bytes: e.ID, Valid: true}
	}
	return ids
}

// leasedInIDOrder is the condition of each statement that updates a batch
// of the relay's events by id ($1, an array of ids) under its lease token
// ($2): the mark and the release. It locks the rows first, in id order, in a
// subquery whose lock sits above its ORDER BY, whatever plan finds them (FOR
// NO KEY UPDATE: the lock the update takes anyway). A bulk job's chunk locks
// its rows in id order too (job.go), and two statements that lock the same
// rows in different orders can deadlock, one of them cancelled after
// deadlock_timeout. The update alone locks rows in the order its scan meets
// them: for a batch of 500 that was a bitmap heap scan, the heap's order, and
// the server's log of the tests' runs held three deadlocks between a mark and
// a chunk (6 December). Turning bitmap and sequential scans off for the
// statement was not enough: the planner then read a whole partial index in
// aggregate order (TestMarkAndReleaseLockInIDOrder). The update then finds
// rows it already holds, so it waits for nothing; it keeps the conditions for
// the re-check of a row a concurrent transaction changed before the subquery
// locked it.
const leasedInIDOrder = `id = ANY (ARRAY(
		        SELECT l.id FROM outbox_event l
		         WHERE l.id = ANY($1) AND l.lock_token = $2 AND l.status = 'pending'
		         ORDER BY l.id
		           FOR NO KEY UPDATE))
		   AND lock_token = $2 AND status = 'pending'`

// markPublishedSQL marks a batch published where our lease token is still
// on it. It commits asynchronously (synchronous_commit off for this
// statement's transaction only, through set_config(..., true)): the mark is
// the one write whose loss is harmless, because a mark lost in a server crash
// leaves the events pending under an expiring lease and they are published
// again, which consumers absorb (the inbox dedupes by event id). Claims,
// failures, releases and every business write still commit synchronously.
// Not waiting for the WAL flush takes one disk round trip off every batch.
// It writes the backlog delta of what it marked in the same statement
// (countedUpdate), so the delta is exactly as durable as the mark.
var markPublishedSQL = countedUpdate(`'pending'`, `
		UPDATE outbox_event
		   SET status = 'published', published_at = coalesce($3::timestamptz, statement_timestamp()), locked_until = NULL,
		       replay_to = NULL
		  FROM (SELECT set_config('synchronous_commit', 'off', true)) async_commit
		 WHERE `+leasedInIDOrder+`
		RETURNING topic AS delta_topic, status AS delta_status`, `u.delta_topic`)

// markPublished marks events published only while our lease token is still
// on them: a relay whose lease expired and was re-claimed marks nothing.
func (r *Relay) markPublished(ctx context.Context, evs []claimed, token uuid.UUID) (int, error) {
	if len(evs) == 0 {
		return 0, nil
	}
	ids := idsOf(evs)
	rows, err := r.pool.Query(ctx, markPublishedSQL, ids, token, r.nowArg())
	if err != nil {
		return 0, fmt.Errorf("outbox: mark %d published: %w", len(ids), err)
	}
	defer rows.Close()
	// One counter update per topic, not per event: a batch usually holds
	// one or a few topics.
	perTopic := map[string]int{}
	n := 0
	for rows.Next() {
		var topic string
		if err := rows.Scan(&topic); err != nil {
			return n, fmt.Errorf("outbox: mark published: %w", err)
		}
		perTopic[topic]++
		n++
	}
	if err := rows.Err(); err != nil {
		return n, fmt.Errorf("outbox: mark %d published: %w", len(ids), err)
	}
	for topic, k := range perTopic {
		r.m.published.WithLabelValues(topic).Add(float64(k))
	}
	r.stats.published.Add(int64(n))
	if n > 0 {
		r.outage.Store(0)
		now := time.Now()
		r.lastPublish.Store(&now)
	}
	return n, nil
}

const maxErrorText = 2000

// errorText is a publish error as stored in last_error.
func errorText(err error) string {
	msg := err.Error()
	if len(msg) > maxErrorText {
		msg = msg[:maxErrorText]
	}
	return msg
}

// recordFailure stores the error and backs the event off, or moves it to
// dead after its last allowed attempt. It also needs our lease token. An
// outage never comes here (giveBack): it is not the event's failure.
func (r *Relay) recordFailure(ctx context.Context, f failure, token uuid.UUID) (dead bool, delay time.Duration, lost bool, err error) {
	r.m.failures.Inc()
	r.stats.failed.Add(1)
	msg := errorText(f.err)
	r.lastFailure.Store(&relayFailure{text: msg, at: time.Now()})
	delay = r.cfg.Backoff.Delay(f.ev.Attempts)
	var status string
	// A death moves the event from the pending count to the dead count: the
	// statement writes that delta itself (countedUpdate).
	err = r.pool.QueryRow(ctx, countedUpdate(`'pending'`, `
		WITH t AS (SELECT coalesce($5::timestamptz, statement_timestamp()) AS now,
		                  e0.attempts >= $4 AS dies
		             FROM outbox_event e0 WHERE e0.id = $1)
		UPDATE outbox_event e
		   SET last_error   = $3,
		       locked_until = NULL,
		       lock_token   = NULL,
		       status       = CASE WHEN t.dies THEN 'dead' ELSE 'pending' END,
		       dead_at      = CASE WHEN t.dies THEN t.now END,
		       dead_reason  = CASE WHEN t.dies THEN 'max attempts reached (' || e.attempts || ')' END,
		       available_at = CASE WHEN t.dies THEN e.available_at
		                           ELSE t.now + $6::bigint * interval '1 microsecond' END
		  FROM t
		 WHERE e.id = $1 AND e.lock_token = $2 AND e.status = 'pending'
		RETURNING e.topic AS delta_topic, e.status AS delta_status`, `u.delta_status`),
		f.ev.ID, token, msg, r.cfg.MaxAttempts, r.nowArg(), delay.Microseconds()).Scan(&status)
	if errors.Is(err, pgx.ErrNoRows) {
		// Our lease is gone: whoever holds the event now decides its fate.
		r.stats.lost.Add(1)
		return false, 0, true, nil
	}
	if err != nil {
		return false, 0, false, fmt.Errorf("outbox: record failure of %s: %w", f.ev.ID, err)
	}
	if status == StatusDead {
		r.m.dead.Inc()
		r.stats.dead.Add(1)
		r.log.Error("outbox: event dead-lettered", "id", f.ev.ID, "topic", f.ev.Topic, "attempts", f.ev.Attempts, "err", msg)
		return true, 0, false, nil
	}
	r.log.Warn("outbox: publish failed; backing off", "id", f.ev.ID, "topic", f.ev.Topic, "attempts", f.ev.Attempts, "retry_in", delay, "err", msg)
	return false, delay, false, nil
}

// giveBack returns events whose publish met a broker outage: no attempt
// counted, claimable again at once, the outage as their last error (what
// the console shows), in one statement for the whole batch. The relay
// pauses instead (Run), so the events are never pushed into the future: when
// the broker is back, the first relay that probes takes them.
func (r *Relay) giveBack(ctx context.Context, fs []failure, token uuid.UUID) error {
	evs := make([]claimed, len(fs))
	for i, f := range fs {
		evs[i] = f.ev
	}
	r.m.failures.Add(float64(len(fs)))
	r.stats.failed.Add(int64(len(fs)))
	msg := errorText(fs[0].err)
	r.lastFailure.Store(&relayFailure{text: msg, at: time.Now()})
	if err := r.release(ctx, evs, token, 0, msg); err != nil {
		return fmt.Errorf("outbox: give back after a broker outage: %w", err)
	}
	r.log.Warn("outbox: broker unavailable; events given back, relay pausing", "count", len(evs), "outage_batches", r.outage.Load(), "err", msg)
	return nil
}

// setPaused records whether the relay pauses on a broker outage after its
// last batch: the gauge counts the process's relays that do. A batch that
// published, or found nothing to publish, ends the pause; so does Run's end.
func (r *Relay) setPaused(paused bool) {
	if r.paused.Swap(paused) == paused {
		return
	}
	if paused {
		r.m.unavailable.Inc()
	} else {
		r.m.unavailable.Dec()
	}
	select {
	case r.reportNow <- struct{}{}:
	default: // a report is already due
	}
}

// outagePause is how long Run waits before claiming again after the run-th
// batch in a row met a broker outage: the backoff schedule, capped at
// OutagePauseCap, so a long outage costs one probe per relay per pause and
// the relay notices the broker's return within one pause.
func (r *Relay) outagePause(run int) time.Duration {
	b := r.cfg.Backoff
	b.Cap = r.cfg.OutagePauseCap
	return b.Delay(run)
}

// release gives events back without counting an attempt, not before delay,
// with lastError as their last error when it is not empty.
func (r *Relay) release(ctx context.Context, evs []claimed, token uuid.UUID, delay time.Duration, lastError string) error {
	if len(evs) == 0 {
		return nil
	}
	ids := idsOf(evs)
	_, err := r.pool.Exec(ctx, `
		UPDATE outbox_event
		   SET locked_until = NULL, lock_token = NULL, attempts = greatest(attempts - 1, 0),
		       available_at = greatest(available_at, coalesce($3::timestamptz, statement_timestamp()) + $4::bigint * interval '1 microsecond'),
		       last_error = coalesce(nullif($5, ''), last_error)
		 WHERE `+leasedInIDOrder,
		ids, token, r.nowArg(), delay.Microseconds(), lastError)
	if err != nil {
		return fmt.Errorf("outbox: release %d events: %w", len(ids), err)
	}
	return nil
}

// Run claims and publishes until ctx ends, then returns nil. After a full
// batch it claims the next one while publishing this one. It claims again
// at once after a batch that was full or published anything, otherwise sleeps up to PollInterval or until a
// NOTIFY on db.OutboxChannel arrives (a db.Listener holds its own
// connection; polling is the fallback when notifications are lost or the
// listener is down). It returns only after the listener has stopped. While
// it runs, the relay reports in outbox_relay for the console (report.go).
func (r *Relay) Run(ctx context.Context) error {
	defer func() { // a stopped relay pauses no more
		if r.paused.Swap(false) {
			r.m.unavailable.Dec()
		}
	}()
	// The relay's row in outbox_relay: reported while Run runs, deleted
	// when it returns (report.go).
	var reporting sync.WaitGroup
	rctx, stopReporting := context.WithCancel(ctx)
	reporting.Go(func() { r.reportLoop(rctx) })
	defer func() {
		stopReporting()
		reporting.Wait()
		r.signOff(ctx)
	}()
	var wake <-chan struct{} // nil: never ready, poll only
	if !r.cfg.DisableListen {
		l := db.NewListener(r.pool, db.OutboxChannel, r.log)
		var wg sync.WaitGroup
		wg.Go(func() { l.Run(ctx) })
		defer wg.Wait()
		wake = l.Wake()
	}
	r.log.Info("outbox: relay started", "batch", r.cfg.BatchSize, "lease", r.cfg.Lease, "poll", r.cfg.PollInterval, "ordered", !r.cfg.DisableOrdering)
	// ahead is a claim already under way: after a full batch the next one is
	// claimed while this one is published and marked, so the database works
	// on one batch while the broker works on the other. The claimed-ahead
	// batch's lease runs meanwhile; process stops starting publishes before
	// it could outlive the lease, as for any batch. With ordering on, the
	// claim ahead cannot take a later event of an aggregate in flight: that
	// event is still pending, which holds its successors back.
	var ahead chan claimedBatch
	claimAhead := func() chan claimedBatch {
		c := make(chan claimedBatch, 1)
		go func() { c <- r.claimBatch(ctx) }()
		return c
	}
	for {
		var cb claimedBatch
		if ahead != nil {
			cb = <-ahead
			ahead = nil
		} else {
			cb = r.claimBatch(ctx)
		}
		if cb.err == nil && len(cb.events) >= r.cfg.BatchSize && ctx.Err() == nil {
			ahead = claimAhead()
		}
		res, err := r.process(ctx, cb)
		wasPaused := r.paused.Load()
		r.setPaused(res.Unavailable > 0 && ctx.Err() == nil)
		if wasPaused && res.Published > 0 && res.Unavailable == 0 {
			// The pause's end in the log too, once the broker took a batch:
			// its last line was "relay pausing" long after the relay
			// published again (an outage drill).
			r.log.Info("outbox: the broker takes messages again; relay resumes", "published", res.Published)
		}
		if ctx.Err() != nil {
			if ahead != nil {
				// Give back what was claimed ahead: with ctx done, process
				// publishes nothing and releases the batch at once.
				_, _ = r.process(ctx, <-ahead)
			}
			r.log.Info("outbox: relay stopped", "published", r.stats.published.Load())
			return nil
		}
		if res.Unavailable > 0 {
			if err != nil {
				r.log.Warn("outbox: relay cycle failed", "err", err)
			}
			// The broker cannot be reached: give back what was claimed
			// ahead without trying it, and pause before the next claim,
			// whatever NOTIFYs say (they mean more events, not a broker).
			if ahead != nil {
				if cb := <-ahead; cb.err == nil && cb.awaitLease() == nil {
					dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
					if err := r.release(dctx, cb.events, cb.token, 0, ""); err != nil {
						r.log.Warn("outbox: release the batch claimed ahead", "err", err)
					}
					cancel()
				}
				ahead = nil
			}
			t := time.NewTimer(r.outagePause(res.OutageRun))
			select {
			case <-ctx.Done():
				t.Stop()
				r.log.Info("outbox: relay stopped", "published", r.stats.published.Load())
				return nil
			case <-t.C:
			}
			continue
		}
		if err != nil {
			r.log.Warn("outbox: relay cycle failed", "err", err)
		} else if res.Claimed >= r.cfg.BatchSize || res.Published > 0 {
			// A full batch means more is waiting; a published event may have
			// unblocked the next event of its aggregate (ordering holds a
			// batch to one event per aggregate). Either way, claim again now.
			continue
		}
		if ahead != nil {
			continue
		}
		t := time.NewTimer(r.cfg.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			r.log.Info("outbox: relay stopped", "published", r.stats.published.Load())
			return nil
		case <-wake:
			t.Stop()
		case <-t.C:
		}
	}
}
