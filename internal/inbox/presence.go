package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db"
)

// A running consumer process reports into inbox_consumer_process (migration
// 00028), as relays report into outbox_relay: when it starts, every
// ReportInterval, and at once when it takes or loses a shard; it deletes its
// row when Run returns. The console's inbox page reads the rows
// (ListProcesses, Cover), so it can say that a consumer reads on another
// shard count than the relays publish on, or that some shards are owned by
// no running process: both look like a consumer with nothing to do in its
// counters alone.
//
// A process that stops without deleting its row is silent once expires_at
// passes, ProcessSilentAfter intervals after its last report; reports remove
// rows silent for longer than processForgetAfter.

// DefaultReportInterval is how often a consumer process reports that it
// runs.
const DefaultReportInterval = 5 * time.Second

// ProcessSilentAfter is how many report intervals without a report make a
// consumer process silent.
const ProcessSilentAfter = 3

// processForgetAfter is how long a silent process's row is kept and shown.
const processForgetAfter = time.Hour

// forgetInterval is processForgetAfter as an SQL interval literal.
var forgetInterval = fmt.Sprintf("interval '%d seconds'", int64(processForgetAfter/time.Second))

// presenceSQL writes the process's row, and removes rows silent for an hour
// in the same statement (SKIP LOCKED: two processes cleaning up at once
// neither wait for nor deadlock on each other).
const presenceSQL = `
WITH gone AS (
	DELETE FROM inbox_consumer_process WHERE id IN (
		SELECT id FROM inbox_consumer_process
		 WHERE expires_at < statement_timestamp() - $6::bigint * interval '1 microsecond' AND id <> $1
		   FOR UPDATE SKIP LOCKED))
INSERT INTO inbox_consumer_process AS p (id, consumer, host, pid, started_at, seen_at, expires_at, shards, owned, held,
                                         applied, applied_at, failed, failed_at)
VALUES ($1, $2, $3, $4, statement_timestamp(), statement_timestamp(),
        statement_timestamp() + $5::bigint * interval '1 microsecond', $7, $8, $9,
        $10, statement_timestamp() - $11::bigint * interval '1 microsecond',
        $12, statement_timestamp() - $13::bigint * interval '1 microsecond')
ON CONFLICT (id) DO UPDATE
   SET seen_at = excluded.seen_at, expires_at = excluded.expires_at, held = excluded.held, applied = excluded.applied,
       -- Kept while the count stands: the time is worked out again at each
       -- report, to within the report's own latency, and must not wander.
       applied_at = CASE WHEN excluded.applied <> p.applied OR p.applied_at IS NULL
                         THEN excluded.applied_at ELSE p.applied_at END,
       failed = excluded.failed,
       failed_at = CASE WHEN excluded.failed <> p.failed OR p.failed_at IS NULL
                        THEN excluded.failed_at ELSE p.failed_at END`

// presence is one consumer process's row.
type presence struct {
	pool     *pgxpool.Pool
	log      *slog.Logger
	id       uuid.UUID
	consumer string
	host     string
	pid      int
	shards   int     // 0: unsharded
	owned    []int32 // nil: every shard
	interval time.Duration
	now      chan struct{}
	// applied is how many events the process has applied since it
	// started, act when it last did and how it failed, for its report.
	applied *atomic.Int64
	act     *activity

	mu   sync.Mutex
	held []int32
}

// activity is when a consumer process last applied an event, and how
// often and when last a message or batch failed, for its report.
type activity struct {
	lastApplied atomic.Pointer[time.Time]
	failed      atomic.Int64
	lastFailed  atomic.Pointer[time.Time]
}

func (a *activity) didApply() {
	now := time.Now()
	a.lastApplied.Store(&now)
}

func (a *activity) didFail() {
	now := time.Now()
	a.lastFailed.Store(&now)
	a.failed.Add(1)
}

// since is how long ago *at was in microseconds, by this process's
// monotonic clock (nil: never).
func since(at *time.Time) *int64 {
	if at == nil {
		return nil
	}
	us := time.Since(*at).Microseconds()
	return &us
}

func newPresence(in *Inbox, consumer string, shards int, owned []int, interval time.Duration,
	applied *atomic.Int64, act *activity) *presence {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	if interval <= 0 {
		interval = DefaultReportInterval
	}
	p := &presence{pool: in.pool, log: in.log, id: uuid.New(), consumer: consumer, host: host, pid: os.Getpid(),
		shards: shards, interval: interval, now: make(chan struct{}, 1), held: []int32{}, applied: applied, act: act}
	if owned != nil {
		p.owned = toInt32s(owned)
		slices.Sort(p.owned)
	}
	return p
}

func toInt32s(s []int) []int32 {
	out := make([]int32, len(s))
	for i, v := range s {
		out[i] = int32(v)
	}
	return out
}

// setHeld records the shards the process reads now, and reports at once
// when they changed.
func (p *presence) setHeld(held []int) {
	h := toInt32s(held)
	slices.Sort(h)
	p.mu.Lock()
	changed := !slices.Equal(h, p.held)
	p.held = h
	p.mu.Unlock()
	if changed {
		select {
		case p.now <- struct{}{}:
		default:
		}
	}
}

func (p *presence) report(ctx context.Context) error {
	p.mu.Lock()
	held := p.held
	p.mu.Unlock()
	// The last apply and failure go as how long ago they were, by this
	// process's monotonic clock (NULL: none yet).
	_, err := p.pool.Exec(ctx, presenceSQL, p.id, p.consumer, p.host, p.pid,
		(ProcessSilentAfter * p.interval).Microseconds(), processForgetAfter.Microseconds(), p.shards, p.owned, held,
		p.applied.Load(), since(p.act.lastApplied.Load()), p.act.failed.Load(), since(p.act.lastFailed.Load()))
	if err != nil {
		return fmt.Errorf("inbox: consumer report: %w", err)
	}
	return nil
}

// start reports until the returned stop is called; stop deletes the row
// when signOff says the process stops on purpose. One that gives up (its
// broker gone past its retries) leaves its row to go silent, so the console
// flags it: signed off, it read as a deliberate stop while its queue filled
// with nobody reading (a RabbitMQ outage drill).
// A failed report is logged once per run of failures: the consumer goes on
// applying meanwhile (its database is the one it reports to).
func (p *presence) start(ctx context.Context) (stop func(signOff bool)) {
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(p.interval)
		defer t.Stop()
		failing := false
		for {
			// A report is not cut by stop: cut, its statement could still
			// commit on the server after the sign-off's DELETE (another
			// connection), and leave the row of a process that signed off
			// (a loaded CI run met such a row). stop waits for it instead.
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(lctx), p.interval)
			err := p.report(rctx)
			rcancel()
			switch {
			case err != nil && lctx.Err() == nil && !failing:
				p.log.Warn("inbox: consumer could not report; the console may show it as silent", "consumer", p.consumer, "err", err)
				failing = true
			case err == nil && failing:
				p.log.Info("inbox: consumer reports again", "consumer", p.consumer)
				failing = false
			}
			select {
			case <-lctx.Done():
				return
			case <-t.C:
			case <-p.now:
			}
		}
	}()
	return func(signOff bool) {
		cancel()
		<-done
		if !signOff {
			p.log.Error("inbox: consumer stops on an error, without signing off: the console shows it as silent", "consumer", p.consumer)
			return
		}
		dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer dcancel()
		if _, err := p.pool.Exec(dctx, `DELETE FROM inbox_consumer_process WHERE id = $1`, p.id); err != nil {
			p.log.Warn("inbox: consumer could not sign off; the console shows it as silent for an hour", "consumer", p.consumer, "err", err)
		}
	}
}

// ProcessRow is one consumer process's report, as the inbox page lists it.
type ProcessRow struct {
	Consumer  string    `json:"consumer"`
	Host      string    `json:"host"`
	PID       int       `json:"pid"`
	StartedAt time.Time `json:"started_at"`
	SeenAt    time.Time `json:"seen_at"` // its last report
	// Silent: stopped reporting without signing off (on the database's
	// clock, as of the read).
	Silent bool  `json:"silent"`
	Shards int   `json:"shards"` // the OUTBOX_SHARDS it reads (0: unsharded)
	Owned  []int `json:"owned"`  // the shards it may read (nil: every one)
	Held   []int `json:"held"`   // the shards it reads now (sharded only)
	// Applied is how many events it has applied since it started,
	// AppliedAt when it last applied one (nil: none yet), as of its last
	// report.
	Applied   int64      `json:"applied"`
	AppliedAt *time.Time `json:"applied_at"`
	// Failed is how many times a message or batch failed since it started
	// (its effect, its read; read again after a pause), FailedAt the last
	// time (nil: never), as of its last report. No error text: the
	// process's log has it.
	Failed   int64      `json:"failed"`
	FailedAt *time.Time `json:"failed_at"`
	// Failing: running, its last failure newer than its last apply, and
	// nothing applied for two report intervals (processFailingSQL).
	Failing bool `json:"failing"`
}

// processFailingSQL is when a consumer process is failing, on the
// database's clock: it runs, its last failure is newer than its last apply,
// and it has applied nothing for two of its report intervals (a third of
// expires_at − seen_at each): it retries something that does not go
// through. The margin keeps a process that applies all the time from
// reading as failing between a failed batch and the next.
const processFailingSQL = `(expires_at > now() AND failed_at > coalesce(applied_at, '-infinity')
	AND coalesce(applied_at, started_at) < now() - (expires_at - seen_at) * 2 / 3)`

// processListLimit bounds the read: one row per process and per process
// killed in the last hour.
const processListLimit = 1000

// ProcessesRead reads the consumer processes' reports as a db.Read part (the
// console's snapshot reads them each tick, for the inbox page, its tile and
// metrics), by consumer, running before silent, then by host and pid. The
// table holds a row per process and per process killed in the last hour.
type ProcessesRead struct {
	Processes []ProcessRow
}

// Expr implements db.Read.
func (r *ProcessesRead) Expr(*db.Args) string {
	return `SELECT coalesce(json_agg(json_build_object('consumer', consumer, 'host', host, 'pid', pid,
	                 'started_at', started_at, 'seen_at', seen_at, 'silent', silent, 'shards', shards,
	                 'owned', owned, 'held', held, 'applied', applied, 'applied_at', applied_at,
	                 'failed', failed, 'failed_at', failed_at, 'failing', coalesce(failing, false))
	                 ORDER BY consumer, silent, host, pid), '[]')
	  FROM (SELECT *, expires_at <= now() AS silent, ` + processFailingSQL + ` AS failing FROM inbox_consumer_process
	         WHERE expires_at >= now() - ` + forgetInterval + `
	         ORDER BY consumer, expires_at <= now(), host, pid
	         LIMIT ` + db.Int(processListLimit) + `) p`
}

// Scan implements db.Read.
func (r *ProcessesRead) Scan(src []byte) error {
	r.Processes = nil
	if err := db.ScanJSON(src, &r.Processes); err != nil {
		return fmt.Errorf("inbox: consumer processes: %w", err)
	}
	return nil
}

// ListProcesses reads the consumer processes' reports on their own, with
// the database's time they were judged at.
func ListProcesses(ctx context.Context, q db.RowQuerier) ([]ProcessRow, time.Time, error) {
	var r ProcessesRead
	at, err := db.ReadAll(ctx, q, &r)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("inbox: list consumer processes: %w", err)
	}
	return r.Processes, at, nil
}

func toInts(s []int32) []int {
	out := make([]int, len(s))
	for i, v := range s {
		out[i] = int(v)
	}
	return out
}

// Coverage is what one consumer's running processes read together.
type Coverage struct {
	Consumer string
	Running  int // processes reporting
	// Silent are its processes that stopped reporting without signing off
	// (in the last hour), and SilentLast the newest of their last reports.
	Silent     int
	SilentLast time.Time
	Shards     []int // the distinct shard counts its running processes read, ascending (0: unsharded)
	// Unowned are the shards, of the one shard count they all read, that no
	// running process may read (CONSUME_SHARDS_OWNED leaves them out): their
	// events wait until a process that owns them starts.
	Unowned []int
	// Unheld are owned by a running process but read by none right now: a
	// shard being taken over (within the consumers' retry interval), or one
	// whose lock a process that does not report holds.
	Unheld []int
}

// Cover sums the processes of each consumer in rows, by consumer name in
// the order rows name them: what the running ones read together, and how
// many are silent.
func Cover(rows []ProcessRow) []Coverage {
	var (
		out []Coverage
		idx = map[string]int{}
	)
	type sets struct{ owned, held map[int]bool }
	acc := map[string]*sets{}
	for _, r := range rows {
		i, ok := idx[r.Consumer]
		if !ok {
			i = len(out)
			idx[r.Consumer] = i
			out = append(out, Coverage{Consumer: r.Consumer})
			acc[r.Consumer] = &sets{owned: map[int]bool{}, held: map[int]bool{}}
		}
		c := &out[i]
		if r.Silent {
			c.Silent++
			if r.SeenAt.After(c.SilentLast) {
				c.SilentLast = r.SeenAt
			}
			continue
		}
		c.Running++
		if !slices.Contains(c.Shards, r.Shards) {
			c.Shards = append(c.Shards, r.Shards)
			slices.Sort(c.Shards)
		}
		s := acc[r.Consumer]
		if r.Owned == nil {
			for k := range r.Shards {
				s.owned[k] = true
			}
		}
		for _, k := range r.Owned {
			s.owned[k] = true
		}
		for _, k := range r.Held {
			s.held[k] = true
		}
	}
	for i := range out {
		c := &out[i]
		if len(c.Shards) != 1 || c.Shards[0] == 0 {
			continue // none running, unsharded, or mixed counts: the mix is the finding
		}
		s := acc[c.Consumer]
		for k := range c.Shards[0] {
			switch {
			case !s.owned[k]:
				c.Unowned = append(c.Unowned, k)
			case !s.held[k]:
				c.Unheld = append(c.Unheld, k)
			}
		}
	}
	return out
}

// Misread are the shard counts c's running processes read that the relays,
// which publish on the shard counts published (outbox.Relays.Shards), do not
// publish on: a process reading one of them never sees what the relays
// publish. Nothing when no relay reports (there is nothing to compare with).
func (c Coverage) Misread(published []int) []int {
	if len(published) == 0 {
		return nil
	}
	var out []int
	for _, n := range c.Shards {
		if !slices.Contains(published, n) {
			out = append(out, n)
		}
	}
	return out
}

// The kinds of Problem.
const (
	// ProblemStopped: every process of the consumer stopped reporting
	// without signing off (killed, its host lost, cut off from the
	// database), and none runs: nothing applies its events.
	ProblemStopped = "stopped"
	// ProblemMixed: its running processes read with different shard
	// counts, each only what is published on its own count.
	ProblemMixed = "mixed"
	// ProblemMisread: a running process reads a shard count the running
	// relays do not publish on.
	ProblemMisread = "misread"
	// ProblemUnowned: shards no running process may read.
	ProblemUnowned = "unowned"
)

// Problem is something one consumer's processes leave unread, as the
// inbox page, the dashboard and sluice_inbox_consumer_problems count it.
type Problem struct {
	Consumer string
	Kind     string // ProblemStopped, ProblemMixed, ProblemMisread or ProblemUnowned
	// Counts are the shard counts read (mixed) or read and not published on
	// (misread); Published the relays' (misread).
	Counts, Published []int
	// Shards is the one count read and Unowned its shards none may read
	// (unowned).
	Shards  int
	Unowned []int
	// SilentLast is the newest last report of its silent processes
	// (stopped).
	SilentLast time.Time
}

// Problems lists what each consumer's processes leave unread, by consumer,
// against the shard counts the running relays publish on (published,
// outbox.Relays.Shards; none: not compared).
func Problems(cov []Coverage, published []int) []Problem {
	var out []Problem
	for _, c := range cov {
		if c.Running == 0 {
			out = append(out, Problem{Consumer: c.Consumer, Kind: ProblemStopped, SilentLast: c.SilentLast})
			continue
		}
		if len(c.Shards) > 1 {
			out = append(out, Problem{Consumer: c.Consumer, Kind: ProblemMixed, Counts: c.Shards})
		}
		if m := c.Misread(published); len(m) > 0 {
			out = append(out, Problem{Consumer: c.Consumer, Kind: ProblemMisread, Counts: m, Published: published})
		}
		if len(c.Unowned) > 0 {
			out = append(out, Problem{Consumer: c.Consumer, Kind: ProblemUnowned, Shards: c.Shards[0], Unowned: c.Unowned})
		}
	}
	return out
}

// peer is another running process of the same consumer and shard count, as
// its last report says.
type peer struct {
	owned []int // nil: every shard
	held  []int
}

func (p peer) mayRead(s int) bool { return p.owned == nil || slices.Contains(p.owned, s) }

// peers reads the reports of the other running processes of p's consumer
// and shard count.
func (p *presence) peers(ctx context.Context) ([]peer, error) {
	rows, err := p.pool.Query(ctx, `
		SELECT owned, held FROM inbox_consumer_process
		 WHERE consumer = $1 AND shards = $2 AND id <> $3 AND expires_at > now()`, p.consumer, p.shards, p.id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []peer
	for rows.Next() {
		var owned, held []int32
		if err := rows.Scan(&owned, &held); err != nil {
			return nil, err
		}
		pr := peer{held: toInts(held)}
		if owned != nil {
			pr.owned = toInts(owned)
		}
		out = append(out, pr)
	}
	return out, rows.Err()
}

// fairShare is how many of shards each of n processes should hold.
func fairShare(shards, n int) int { return (shards + n - 1) / n }

// toRelease picks, among the shards a process holds (mine), those to give
// up so that peers below the fair share can take them: no more than it
// holds above fair, each one a peer below fair may read, as many per peer
// as it lacks, highest shard numbers first. A peer's count is its last
// report's; a shard given up and taken by nobody is taken back at a later
// try (the caller's rule for free shards), so a stale report costs a
// moment, not a shard.
func toRelease(mine []int, fair int, peers []peer) []int {
	spare := len(mine) - fair
	if len(peers) == 0 {
		return nil
	}
	if spare <= 0 {
		return forRestricted(mine, fair, peers)
	}
	cand := slices.Clone(mine)
	slices.Sort(cand)
	slices.Reverse(cand)
	picked := map[int]bool{}
	var out []int
	for _, p := range peers {
		lack := fair - len(p.held)
		for _, s := range cand {
			if spare == 0 || lack <= 0 {
				break
			}
			if !picked[s] && p.mayRead(s) {
				picked[s] = true
				out = append(out, s)
				spare--
				lack--
			}
		}
	}
	return out
}

// forRestricted is what a process at its share gives up: one shard to a
// peer that may read only some shards (CONSUME_SHARDS_OWNED) and lacks one
// of them, when another peer holds more than the share. That one gives a
// shard back to this process at its next try, and the restricted peer,
// which could take none of the others', gets its own. Without it a full CI
// run stopped at 6, 9 and 1 shards where 6, 8 and 2 was the aim: the shard
// the restricted peer lacked sat with a process at its share, and the one
// above it held none the restricted peer could read.
func forRestricted(mine []int, fair int, peers []peer) []int {
	if len(mine) < fair {
		return nil
	}
	over := false
	for _, p := range peers {
		over = over || len(p.held) > fair
	}
	if !over {
		return nil
	}
	cand := slices.Clone(mine)
	slices.Sort(cand)
	slices.Reverse(cand)
	for _, p := range peers {
		if p.owned == nil || len(p.held) >= min(fair, len(p.owned)) {
			continue
		}
		for _, s := range cand {
			if p.mayRead(s) {
				return []int{s}
			}
		}
	}
	return nil
}
