// Package live is the console's one feed per process: a poller reads one
// snapshot of the system per tick (woken early by LISTEN/NOTIFY), keeps an
// hour of them in memory for sparklines, and a hub pushes the rendered
// changes to every subscribed browser. Cost is one query per tick per
// process, whatever the number of browsers, and one more while detail pages
// watch their records (watch.go).
package live

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/payments"
)

// The parts of a snapshot are defined by the rooms that own them.
type (
	TopicBacklog   = outbox.TopicBacklog
	DeadEvent      = outbox.DeadEvent
	UnknownPayment = payments.UnknownPayment
)

// Snapshot is the state of the system at one instant (the database's clock).
type Snapshot struct {
	At               time.Time
	Backlog          []TopicBacklog
	Pending          int64
	InFlight         int64
	OldestPendingAge time.Duration
	Dead             int64
	Paused           []outbox.TopicPause // paused topics: who paused them, when and why
	Held             outbox.Held         // pending events held behind a dead letter of their aggregate
	Published        int64               // published since the previous snapshot
	PublishedPerSec  float64             // Published over the time since the previous snapshot
	Unknown          int64
	ReconcileAge     time.Duration // age of the oldest unknown payment
	StuckProcessing  int64         // idempotency records in processing whose lease expired
	Discrepancies    int64         // open payment discrepancies (provider and our records disagree)
	RecentDead       []DeadEvent
	RecentUnknown    []UnknownPayment
	Consumers        []inbox.ConsumerStats // per consumer: applied, duplicates absorbed, stale dropped
	Jobs             []JobProgress         // unfinished bulk jobs and the newest few, newest first
	Chain            audit.ChainStatus     // the audit chain's latest verifications
	Approvals        payments.PendingState // four-eyes requests waiting (count and newest id)
	Relays           outbox.Relays         // what the relays' reports say: running, paused on a broker outage, silent
	Processes        []inbox.ProcessRow    // the consumer processes' reports
	// Unreachable is when the database stopped answering the feed (this
	// process's clock; zero while it answers): the figures above are then
	// the last ones read, from before, and pages say so (Feed.Latest).
	Unreachable time.Time
}

// ConsumerProblems is what the consumer processes leave unread, against the
// shard counts the running relays publish on: the inbox page's notices, the
// dashboard's Consumers tile and sluice_inbox_consumer_problems.
func (s Snapshot) ConsumerProblems() []inbox.Problem {
	return inbox.Problems(inbox.Cover(s.Processes), s.Relays.Shards)
}

// ConsumerProcesses counts the consumer processes' reports: running, and
// silent (stopped reporting without signing off, in the last hour).
func (s Snapshot) ConsumerProcesses() (running, silent int) {
	for _, p := range s.Processes {
		if p.Silent {
			silent++
		} else {
			running++
		}
	}
	return running, silent
}

// JobProgress is a bulk job's progress (internal/outbox owns it).
type JobProgress = outbox.JobProgress

// Querier is what the poller reads through (a pool; tests wrap it to count).
// The snapshot goes as one batch (db.ReadAllGeneric); ReadOutbox, a page's
// one read, as one statement.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// recentRows is how many dead letters and unknown payments a snapshot lists.
const recentRows = 5

// recentJobs is how many of the newest bulk jobs a snapshot lists besides
// the unfinished ones (the jobs page's top rows, and a job that has just
// ended, in its final state).
const recentJobs = 10

// snapshotReads are the owners' parts of the one statement per tick. Every
// part reads a partial index (pending, dead, unknown, processing,
// published-since, open discrepancies), so its cost follows the live work,
// never the history. since is the previous snapshot's time: the published
// count covers only the rows published since.
type snapshotReads struct {
	backlog   outbox.BacklogRead
	published outbox.PublishedSinceRead
	dead      outbox.RecentDeadRead
	held      outbox.HeldRead
	payments  payments.HealthRead
	inbox     inbox.ConsumersRead
	jobs      outbox.JobsRead
	chain     audit.ChainStatusRead
	approvals payments.PendingRead
	relays    outbox.RelaysRead
	processes inbox.ProcessesRead
}

func newSnapshotReads(since time.Time, cur *outbox.BacklogCursor) *snapshotReads {
	return &snapshotReads{
		backlog:   outbox.BacklogRead{Cursor: cur},
		published: outbox.PublishedSinceRead{Since: since},
		dead:      outbox.RecentDeadRead{Limit: recentRows},
		payments:  payments.HealthRead{Recent: recentRows},
		jobs:      outbox.JobsRead{Recent: recentJobs},
	}
}

func (r *snapshotReads) all() []db.Read {
	return []db.Read{&r.backlog, &r.published, &r.dead, &r.held, &r.payments, &r.inbox, &r.jobs, &r.approvals, &r.chain, &r.relays, &r.processes}
}

// SnapshotQuery is the statement ReadSnapshot runs for a previous snapshot
// at since (for plan tests).
func SnapshotQuery(since time.Time) (string, []any) {
	sql, args := db.Compose(newSnapshotReads(since, nil).all()...)
	return sql, args
}

// ReadSnapshot runs the one statement per tick. prev is the previous
// snapshot's time (zero for the first: then the rate covers the last second).
// cur (nil: none) carries the backlog's head walk from one tick to the next
// (outbox.BacklogCursor): a feed passes its own.
func ReadSnapshot(ctx context.Context, q Querier, prev time.Time, cur *outbox.BacklogCursor) (Snapshot, error) {
	since := prev
	if since.IsZero() {
		since = time.Now().Add(-time.Second)
	}
	r := newSnapshotReads(since, cur)
	// Every tick runs the same statement: on its generic plan, made once
	// per connection, not planned again on each call (db.ReadAllGeneric;
	// TestSnapshotPlanUsesPartialIndexes checks that plan).
	at, err := db.ReadAllGeneric(ctx, q, r.all()...)
	if err != nil {
		return Snapshot{}, fmt.Errorf("live: snapshot: %w", err)
	}
	b, h := r.backlog.Backlog, r.payments.Health
	s := Snapshot{
		At: at, Backlog: b.Topics, Pending: b.Pending, InFlight: b.InFlight, OldestPendingAge: b.OldestPendingAge,
		Dead: b.Dead, Paused: b.Paused, Held: r.held.Held, Published: r.published.Count, Unknown: h.Unknown, ReconcileAge: h.ReconcileAge,
		StuckProcessing: h.StuckProcessing, Discrepancies: h.Discrepancies,
		RecentDead: r.dead.Events, RecentUnknown: h.RecentUnknown, Consumers: r.inbox.Consumers,
		Jobs: r.jobs.Jobs, Chain: r.chain.Status, Approvals: r.approvals.State, Relays: r.relays.Relays,
		Processes: r.processes.Processes,
	}
	if elapsed := s.At.Sub(since).Seconds(); elapsed > 0 {
		s.PublishedPerSec = float64(s.Published) / elapsed
	}
	return s, nil
}

// ReadOutbox reads the outbox's part of a snapshot on its own (backlog, dead
// letters, the recent ones, held), with the same reads the feed composes: a
// page reads it once when it renders, to know what "changed since this page
// loaded" means for the live notice. The other fields stay zero.
func ReadOutbox(ctx context.Context, q Querier) (Snapshot, error) {
	var (
		backlog outbox.BacklogRead
		dead    = outbox.RecentDeadRead{Limit: recentRows}
		held    outbox.HeldRead
	)
	at, err := db.ReadAll(ctx, q, &backlog, &dead, &held)
	if err != nil {
		return Snapshot{}, fmt.Errorf("live: outbox: %w", err)
	}
	b := backlog.Backlog
	return Snapshot{At: at, Backlog: b.Topics, Pending: b.Pending, InFlight: b.InFlight, OldestPendingAge: b.OldestPendingAge,
		Dead: b.Dead, Paused: b.Paused, Held: held.Held, RecentDead: dead.Events}, nil
}
