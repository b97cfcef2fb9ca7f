package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/db"
)

// Kinds of bulk job: the single actions, applied to every event matching a
// filter.
const (
	JobRetry      = "retry"       // dead → pending (as Retry)
	JobDeadLetter = "dead_letter" // pending, not in flight → dead (as DeadLetter)
	JobDiscard    = "discard"     // dead → discarded (as Discard)
	JobReplay     = "replay"      // published → pending again, published once more with its id (see actReplay)
)

// States of a job.
const (
	JobPending   = "pending"
	JobRunning   = "running"
	JobDone      = "done"
	JobCancelled = "cancelled"
	JobFailed    = "failed"
)

// Chunk sizes of a job: rows changed per transaction.
const (
	DefaultJobChunk = 1000
	MaxJobChunk     = 5000
)

// ErrJobNotFound reports a job that does not exist.
var ErrJobNotFound = errors.New("outbox: job not found")

// ErrJobFinished reports a cancel of a job that already ended.
var ErrJobFinished = errors.New("outbox: job already finished")

// Job is a durable bulk action and its progress.
type Job struct {
	ID          uuid.UUID
	Kind        string
	Filter      Filter
	Reason      string
	RequestedBy string
	State       string
	ChunkSize   int
	// Matched is how many events matched (in the kind's status) when the
	// job was created: exactly, or when MatchedMoreThan is not zero, the
	// planner's estimate, a count having stopped past MatchedMoreThan
	// (JobCountExactBelow). MatchedTotal says which.
	Matched         int64
	MatchedMoreThan int64
	Done            int64 // events changed
	Skipped         int64 // events walked but no longer in the expected state (or in flight)
	Failures        int   // chunks failed in a row
	// CancelRequested: the job stops before its next chunk.
	CancelRequested bool
	CreatedAt       time.Time
	StartedAt       *time.Time
	FinishedAt      *time.Time
	UpdatedAt       time.Time
	LastError       string
	ReplayTo        string // replay jobs: the one consumer the replay is for ("" : every consumer)
}

// MatchedTotal is Matched as a Total: exact, or more than MatchedMoreThan
// with the planner's estimate.
func (j Job) MatchedTotal() Total {
	return Total{N: j.Matched, Estimate: j.MatchedMoreThan > 0, MoreThan: j.MatchedMoreThan}
}

// Finished reports whether the job has ended (done, cancelled or failed).
func (j Job) Finished() bool {
	return j.State == JobDone || j.State == JobCancelled || j.State == JobFailed
}

const jobColumns = `id, kind, filter, reason, requested_by, state, chunk_size, matched, done, skipped, failures,
	       cancel_requested_at IS NOT NULL, created_at, started_at, finished_at, updated_at, coalesce(last_error, ''),
	       coalesce(replay_to, ''), coalesce(matched_more_than, 0)`

func scanJob(row pgx.Row) (Job, error) {
	var (
		j      Job
		filter []byte
	)
	err := row.Scan(&j.ID, &j.Kind, &filter, &j.Reason, &j.RequestedBy, &j.State, &j.ChunkSize, &j.Matched, &j.Done,
		&j.Skipped, &j.Failures, &j.CancelRequested, &j.CreatedAt, &j.StartedAt, &j.FinishedAt, &j.UpdatedAt, &j.LastError, &j.ReplayTo,
		&j.MatchedMoreThan)
	if err != nil {
		return Job{}, err
	}
	if err := json.Unmarshal(filter, &j.Filter); err != nil {
		return Job{}, fmt.Errorf("job %s: unreadable filter: %w", j.ID, err)
	}
	return j, nil
}

// kindAction is the single action a job kind applies.
func kindAction(kind string) (action, error) {
	switch kind {
	case JobRetry:
		return actRetry, nil
	case JobDeadLetter:
		return actDeadLetter, nil
	case JobDiscard:
		return actDiscard, nil
	case JobReplay:
		return actReplay, nil
	}
	return action{}, fmt.Errorf("%w: job kind %q is not one of retry, dead_letter, discard, replay", ErrInvalidAction, kind)
}

// JobStatus is the status of the events a job of kind acts on: dead for a
// retry or a discard, pending for a dead-letter, published for a replay
// ("" for an unknown kind). A job's filter without a status matches those
// only, so this is what the filter selects, for the words that describe it.
func JobStatus(kind string) string {
	a, err := kindAction(kind)
	if err != nil {
		return ""
	}
	return a.from
}

// jobWhere is the filter of a job of kind a: f's conditions and the status
// the action applies to. A status in f must agree with it (held is a kind of
// pending; in flight is refused: those events would all be skipped).
func jobWhere(a action, f Filter, args pgx.NamedArgs) (string, error) {
	switch {
	case f.Status == "" || f.Status == a.from:
	case a.from == StatusPending && (f.Status == FilterHeld || f.Status == FilterHeldDead):
	default:
		return "", fmt.Errorf("%w: %s applies to %s events; the filter asks for %s", ErrInvalidFilter, a.name, a.from, f.Status)
	}
	where, err := f.where(args)
	if err != nil {
		return "", err
	}
	where += "\n\t   AND e.status = '" + a.from + "'"
	if f.StateBy != nil {
		args["state_by"] = *f.StateBy
		where += "\n\t   AND e." + stateSince(a.from) + " <= @state_by"
	}
	return where, nil
}

// stateSince is the column that says since when an event has had status
// (created_at for pending: nothing else records it).
func stateSince(status string) string {
	switch status {
	case StatusDead:
		return "dead_at"
	case StatusPublished:
		return "published_at"
	case StatusDiscarded:
		return "discarded_at"
	}
	return "created_at"
}

// JobCountExactBelow is where a dry run, and the job it confirms, stop
// counting: past it they say "more than" it, with the planner's estimate.
// A replay matches published events, the whole history of a topic (5 M
// events: 0.3-1.4 s to count exactly, in the dry run and again in the
// confirming request); a count up to the cap reads at most that many.
const JobCountExactBelow = db.CountExactBelow

// JobPreview is a dry run of a job: what it would touch now.
type JobPreview struct {
	// Count is how many events match now: exactly up to
	// JobCountExactBelow, past it more than that (Count.MoreThan) and
	// about Count.N by the planner's estimate. Count.Counted() is what
	// the confirmation names (see CreateJob).
	Count  Total
	Sample []uuid.UUID // the first few of them in id order (the job's order)
	// At is the dry run's time (the database's): the confirmation carries
	// it as the job's Filter.StateBy.
	At time.Time
}

// Preview counts the events a job of kind with filter f would touch now, up
// to JobCountExactBelow (past it, more than that, and the planner's
// estimate), and lists the first sampleN (at most 100) of them. It changes
// nothing.
func Preview(ctx context.Context, q db.Querier, kind string, f Filter, sampleN int) (JobPreview, error) {
	a, err := kindAction(kind)
	if err != nil {
		return JobPreview{}, err
	}
	// The dry run's time bounds what it counts, and the job it confirms
	// (JobPreview.At): a confirmation acts on what was shown.
	var p JobPreview
	if err := q.QueryRow(ctx, `SELECT statement_timestamp()`).Scan(&p.At); err != nil {
		return JobPreview{}, fmt.Errorf("outbox: preview %s: %w", kind, err)
	}
	f.StateBy = &p.At
	args := pgx.NamedArgs{}
	where, err := jobWhere(a, f, args)
	if err != nil {
		return JobPreview{}, err
	}
	if p.Count, err = db.CountUpTo(ctx, q, "outbox_event e WHERE "+where, args, JobCountExactBelow); err != nil {
		return JobPreview{}, fmt.Errorf("outbox: preview %s: %w", kind, err)
	}
	args["sample"] = min(max(sampleN, 0), 100)
	err = q.QueryRow(ctx, `
		SELECT coalesce((SELECT array_agg(id ORDER BY id) FROM (
		                   SELECT e.id FROM outbox_event e WHERE `+where+` ORDER BY e.id LIMIT @sample) s), '{}')`,
		db.PlanEachCall, args).Scan(&p.Sample)
	if err != nil {
		return JobPreview{}, fmt.Errorf("outbox: preview %s: %w", kind, err)
	}
	return p, nil
}

// ErrConfirmedAlready: CreateJob found the job its dry run's confirmation
// made already (returned with it).
var ErrConfirmedAlready = errors.New("outbox: this dry run's job exists already")

// JobRequest asks for a bulk job.
type JobRequest struct {
	Kind        string
	Filter      Filter
	Reason      string // required for dead_letter and discard
	RequestedBy string // the actor, as the console names it in the audit trail
	ChunkSize   int    // rows per transaction: default DefaultJobChunk, at most MaxJobChunk
	// ReplayTo (replay only) names the one consumer the replay is for; ""
	// replays to every consumer of the events' topics.
	ReplayTo string
}

// CreateJob records a job in tx (write its audit row in the same tx). The
// job covers the events matching when tx runs: it walks ids up to the
// highest one matching now, so events that match later (an event that dies
// after the request) are not swept up, and a job always ends. It counts
// them as Preview does, up to JobCountExactBelow (past it Matched is the
// planner's estimate and MatchedMoreThan says so), so a confirmation
// compares the job's MatchedTotal().Counted() with its dry run's: an exact
// count confirms at most itself, "more than" confirms any number past the
// cap, which is what the operator was shown. The job itself walks every
// matching event.
func CreateJob(ctx context.Context, tx pgx.Tx, req JobRequest) (Job, error) {
	a, err := kindAction(req.Kind)
	if err != nil {
		return Job{}, err
	}
	if a.needs && req.Reason == "" {
		return Job{}, fmt.Errorf("%w: %s needs a reason", ErrInvalidAction, a.name)
	}
	if req.RequestedBy == "" {
		return Job{}, fmt.Errorf("%w: a job needs its requester", ErrInvalidAction)
	}
	if req.ReplayTo != "" {
		if req.Kind != JobReplay {
			return Job{}, fmt.Errorf("%w: only a replay names a consumer", ErrInvalidAction)
		}
		if err := broker.ValidateConsumer(req.ReplayTo); err != nil {
			return Job{}, fmt.Errorf("%w: %v", ErrInvalidAction, err)
		}
	}
	if req.ChunkSize == 0 {
		req.ChunkSize = DefaultJobChunk
	}
	if req.ChunkSize < 1 || req.ChunkSize > MaxJobChunk {
		return Job{}, fmt.Errorf("%w: chunk size must be 1–%d", ErrInvalidAction, MaxJobChunk)
	}
	args := pgx.NamedArgs{}
	where, err := jobWhere(a, req.Filter, args)
	if err != nil {
		return Job{}, err
	}
	// The estimate is used only if the count passes the cap; asked first,
	// it needs no second pass (EXPLAIN reads nothing).
	est, err := db.EstimateRows(ctx, tx, "outbox_event e WHERE "+where, args)
	if err != nil {
		return Job{}, fmt.Errorf("outbox: create %s job: %w", req.Kind, err)
	}
	filter, err := json.Marshal(req.Filter)
	if err != nil {
		return Job{}, fmt.Errorf("outbox: job filter: %w", err)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return Job{}, fmt.Errorf("outbox: new job id: %w", err)
	}
	if req.Filter.StateBy != nil {
		// One dry run, one job: a confirmation sent again (back and
		// reload, a double click) names the same dry run, to the
		// microsecond, and gets the job it made rather than a second one
		// over whatever matches by then.
		to := replayTo(Job{ReplayTo: req.ReplayTo})
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "outbox_job "+req.Kind+" "+req.ReplayTo+" "+string(filter)); err != nil {
			return Job{}, fmt.Errorf("outbox: create %s job: %w", req.Kind, err)
		}
		j, err := scanJob(tx.QueryRow(ctx, `SELECT `+jobColumns+` FROM outbox_job
			WHERE kind = $1 AND filter = $2::jsonb AND replay_to IS NOT DISTINCT FROM $3 ORDER BY id DESC LIMIT 1`,
			req.Kind, string(filter), to))
		switch {
		case err == nil:
			return j, ErrConfirmedAlready
		case !errors.Is(err, pgx.ErrNoRows):
			return Job{}, fmt.Errorf("outbox: create %s job: %w", req.Kind, err)
		}
	}
	args["id"], args["kind"], args["filter"], args["reason"] = id, req.Kind, string(filter), req.Reason
	args["requested_by"], args["chunk"] = req.RequestedBy, req.ChunkSize
	args["replay_to"] = replayTo(Job{ReplayTo: req.ReplayTo})
	args["most"], args["estimate"] = int64(JobCountExactBelow), est
	// One statement, so the count and the highest id are of one snapshot.
	// MATERIALIZED: inlined, m.n's subquery would run once per use.
	j, err := scanJob(tx.QueryRow(ctx, `
		WITH m AS MATERIALIZED (SELECT (SELECT count(*) FROM (SELECT 1 FROM outbox_event e WHERE `+where+` LIMIT @most + 1) c) AS n,
		                  (SELECT e.id FROM outbox_event e WHERE `+where+` ORDER BY e.id DESC LIMIT 1) AS upto)
		INSERT INTO outbox_job (id, kind, filter, reason, requested_by, chunk_size, matched, matched_more_than, upto_id, state,
		                        finished_at, replay_to)
		SELECT @id, @kind, @filter::jsonb, @reason, @requested_by, @chunk,
		       CASE WHEN m.n > @most THEN greatest(@estimate, @most + 1) ELSE m.n END, CASE WHEN m.n > @most THEN @most END,
		       m.upto, CASE WHEN m.n = 0 THEN 'done' ELSE 'pending' END, CASE WHEN m.n = 0 THEN now() END, @replay_to
		  FROM m
		RETURNING `+jobColumns, db.PlanEachCall, args))
	if err != nil {
		return Job{}, fmt.Errorf("outbox: create %s job: %w", req.Kind, err)
	}
	return j, nil
}

// GetJob reads one job.
func GetJob(ctx context.Context, q db.Querier, id uuid.UUID) (Job, error) {
	j, err := scanJob(q.QueryRow(ctx, `SELECT `+jobColumns+` FROM outbox_job WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Job{}, ErrJobNotFound
	}
	if err != nil {
		return Job{}, fmt.Errorf("outbox: job %s: %w", id, err)
	}
	return j, nil
}

// ListJobs returns the newest jobs, at most limit (≤ 500), newest first.
func ListJobs(ctx context.Context, q db.Querier, limit int) ([]Job, error) {
	if limit <= 0 || limit > 500 {
		limit = 50
	}
	rows, err := q.Query(ctx, `SELECT `+jobColumns+` FROM outbox_job ORDER BY id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list jobs: %w", err)
	}
	jobs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Job, error) { return scanJob(r) })
	if err != nil {
		return nil, fmt.Errorf("outbox: list jobs: %w", err)
	}
	return jobs, nil
}

// CancelJob asks job id to stop (write its audit row in the same q): a job
// that has not started is cancelled at once; a running one stops before its
// next chunk (the chunk in progress, if any, commits first: the request
// waits for it). A finished job returns ErrJobFinished with the job.
func CancelJob(ctx context.Context, q db.Querier, id uuid.UUID) (Job, error) {
	j, err := scanJob(q.QueryRow(ctx, `
		UPDATE outbox_job
		   SET cancel_requested_at = coalesce(cancel_requested_at, now()), updated_at = now(),
		       state = CASE WHEN state = 'pending' THEN 'cancelled' ELSE state END,
		       finished_at = CASE WHEN state = 'pending' THEN now() ELSE finished_at END
		 WHERE id = $1 AND state IN ('pending', 'running')
		RETURNING `+jobColumns, id))
	if errors.Is(err, pgx.ErrNoRows) {
		cur, gerr := GetJob(ctx, q, id)
		if gerr != nil {
			return Job{}, gerr
		}
		return cur, ErrJobFinished
	}
	if err != nil {
		return Job{}, fmt.Errorf("outbox: cancel job %s: %w", id, err)
	}
	return j, nil
}

// ChunkHook runs in each chunk's transaction with the ids the chunk changed
// (never empty): the console writes the chunk's audit row there, so the
// audit trail and the change commit together. An error rolls the chunk back.
type ChunkHook func(ctx context.Context, tx pgx.Tx, job Job, ids []uuid.UUID) error

// EndHook runs in the transaction that ends a job as done, cancelled or
// failed (job is as that transaction leaves it): the console writes the
// audit row that closes the job there. A job ends once (every ending is a
// compare-and-set on its running state), so the hook runs once per job
// ending through a runner. An error rolls the ending back: the job stays
// running and is retried when its lease expires. Jobs that end outside a
// runner (CreateJob matching nothing, CancelJob of a pending job) end in
// the caller's transaction, where the caller writes that row itself.
type EndHook func(ctx context.Context, tx pgx.Tx, job Job) error

// JobRunnerConfig tunes a JobRunner. The zero value of every field is its
// default.
type JobRunnerConfig struct {
	Name         string        // for logs (default "jobs")
	Lease        time.Duration // how long a claimed job is ours without a chunk committing (default 1m)
	PollInterval time.Duration // sleep when no job is runnable (default 1s)
	RetryDelay   time.Duration // wait after a failed chunk before any runner tries again (default 5s)
	MaxFailures  int           // chunks failed in a row before the job fails (default 3)
	// Hook runs in every chunk's transaction (optional).
	Hook ChunkHook
	// OnEnd runs in the transaction that ends a job (optional).
	OnEnd EndHook
	// OnProgress is called after every committed chunk and when a job ends
	// (optional), for the console to push progress; it must not block long.
	OnProgress func(Job)
	// Now is the lease clock; nil means the database clock. Tests inject one.
	Now func() time.Time
}

// JobRunner runs bulk jobs: it claims a runnable job under a lease (as the
// relay claims events, so another console replica takes over a job whose
// runner died) and walks the events matching its filter in id order, one
// chunk per transaction. Each chunk locks its events, changes those still in
// the expected state, calls the hook, and records the cursor and totals in
// the job row, all in that transaction: a crash resumes at the next chunk
// with no event done twice and none skipped. No lock is held between chunks,
// so relays and operators keep working while a job runs.
type JobRunner struct {
	pool *pgxpool.Pool
	cfg  JobRunnerConfig
	log  *slog.Logger
}

// NewJobRunner builds a runner on pool; log may be nil.
func NewJobRunner(pool *pgxpool.Pool, cfg JobRunnerConfig, log *slog.Logger) (*JobRunner, error) {
	if pool == nil {
		return nil, errors.New("outbox: job runner needs a pool")
	}
	if cfg.Name == "" {
		cfg.Name = "jobs"
	}
	if cfg.Lease <= 0 {
		cfg.Lease = time.Minute
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.RetryDelay <= 0 {
		cfg.RetryDelay = 5 * time.Second
	}
	if cfg.MaxFailures <= 0 {
		cfg.MaxFailures = 3
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &JobRunner{pool: pool, cfg: cfg, log: log.With("job_runner", cfg.Name)}, nil
}

func (r *JobRunner) nowArg() *time.Time {
	if r.cfg.Now == nil {
		return nil
	}
	t := r.cfg.Now()
	return &t
}

// Run runs jobs until ctx ends, then returns nil.
func (r *JobRunner) Run(ctx context.Context) error {
	for {
		ran, err := r.RunOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			r.log.Warn("outbox: job runner cycle failed", "err", err)
		}
		if ran && err == nil {
			continue
		}
		t := time.NewTimer(r.cfg.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// RunOnce claims one runnable job (pending, or running under an expired
// lease) and works it until it ends, is cancelled, fails a chunk, loses its
// lease or ctx ends. It reports whether it claimed a job.
func (r *JobRunner) RunOnce(ctx context.Context) (bool, error) {
	token, err := uuid.NewRandom()
	if err != nil {
		return false, fmt.Errorf("outbox: job lock token: %w", err)
	}
	job, err := scanJob(r.pool.QueryRow(ctx, `
		WITH t AS (SELECT coalesce(@now::timestamptz, clock_timestamp()) AS now)
		UPDATE outbox_job j
		   SET state = 'running', lock_token = @token, locked_until = t.now + @lease::bigint * interval '1 microsecond',
		       started_at = coalesce(j.started_at, now()), updated_at = now()
		  FROM t
		 WHERE j.id = (SELECT id FROM outbox_job, t
		                WHERE state = 'pending'
		                   OR (state = 'running' AND (locked_until IS NULL OR locked_until < t.now))
		                ORDER BY id LIMIT 1
		                FOR UPDATE OF outbox_job SKIP LOCKED)
		RETURNING `+jobColumns,
		pgx.NamedArgs{"now": r.nowArg(), "token": token, "lease": r.cfg.Lease.Microseconds()}))
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("outbox: claim job: %w", err)
	}
	r.log.Info("outbox: job claimed", "job", job.ID, "kind", job.Kind, "done", job.Done, "matched", job.Matched)
	for {
		next, err := r.chunk(ctx, job.ID, token)
		if err == nil {
			r.progress(next)
			if next.State != JobRunning {
				r.log.Info("outbox: job ended", "job", job.ID, "state", next.State, "done", next.Done, "skipped", next.Skipped)
				return true, nil
			}
			continue
		}
		if errors.Is(err, errLeaseLost) {
			r.log.Warn("outbox: job lease lost; another runner has it", "job", job.ID)
			return true, nil
		}
		if ctx.Err() != nil {
			// Stopping: give the job back so another runner resumes it at
			// once (a crash instead leaves it until the lease expires).
			r.release(context.WithoutCancel(ctx), job.ID, token, 0, "")
			return true, nil
		}
		r.log.Warn("outbox: job chunk failed", "job", job.ID, "err", err)
		r.release(context.WithoutCancel(ctx), job.ID, token, r.cfg.RetryDelay, err.Error())
		return true, err
	}
}

var errLeaseLost = errors.New("outbox: job lease lost")

func (r *JobRunner) progress(j Job) {
	if r.cfg.OnProgress != nil {
		r.cfg.OnProgress(j)
	}
}

// release gives a job back after a failed chunk or on shutdown: runnable
// again after delay, failed after MaxFailures chunk failures in a row (then
// OnEnd runs in the same transaction).
func (r *JobRunner) release(ctx context.Context, id, token uuid.UUID, delay time.Duration, lastErr string) {
	failed := 0
	if lastErr != "" {
		failed = 1
		if len(lastErr) > maxErrorText {
			lastErr = lastErr[:maxErrorText]
		}
	}
	j, err := db.WithTxV(ctx, r.pool, func(tx pgx.Tx) (Job, error) {
		j, err := scanJob(tx.QueryRow(ctx, `
		WITH t AS (SELECT coalesce(@now::timestamptz, clock_timestamp()) AS now)
		UPDATE outbox_job j
		   SET failures = j.failures + @failed,
		       last_error = CASE WHEN @failed = 1 THEN @err ELSE j.last_error END,
		       state = CASE WHEN j.failures + @failed >= @max THEN 'failed' ELSE j.state END,
		       finished_at = CASE WHEN j.failures + @failed >= @max THEN now() END,
		       lock_token = NULL,
		       locked_until = t.now + @delay::bigint * interval '1 microsecond',
		       updated_at = now()
		  FROM t
		 WHERE j.id = @id AND j.lock_token = @token AND j.state = 'running'
		RETURNING `+jobColumns,
			pgx.NamedArgs{"now": r.nowArg(), "failed": failed, "err": lastErr, "max": r.cfg.MaxFailures,
				"delay": delay.Microseconds(), "id": id, "token": token}))
		if err == nil && j.State == JobFailed && r.cfg.OnEnd != nil {
			err = r.cfg.OnEnd(ctx, tx, j)
		}
		return j, err
	})
	if err != nil {
		if !errors.Is(err, pgx.ErrNoRows) {
			r.log.Warn("outbox: release job", "job", id, "err", err)
		}
		return
	}
	r.progress(j)
}

// chunk runs one chunk of job id in its own transaction and returns the job
// as committed. It re-checks the lease under the job row's lock first, so
// two runners never work one job at once: a runner that was too slow finds
// another's token and stops.
func (r *JobRunner) chunk(ctx context.Context, id, token uuid.UUID) (Job, error) {
	return db.WithTxV(ctx, r.pool, func(tx pgx.Tx) (Job, error) {
		var (
			job          Job
			cursor, upto *uuid.UUID
		)
		row := tx.QueryRow(ctx, `SELECT `+jobColumns+`, cursor_id, upto_id FROM outbox_job
			WHERE id = $1 AND lock_token = $2 AND state = 'running' FOR UPDATE`, id, token)
		var filter []byte
		err := row.Scan(&job.ID, &job.Kind, &filter, &job.Reason, &job.RequestedBy, &job.State, &job.ChunkSize, &job.Matched,
			&job.Done, &job.Skipped, &job.Failures, &job.CancelRequested, &job.CreatedAt, &job.StartedAt, &job.FinishedAt,
			&job.UpdatedAt, &job.LastError, &job.ReplayTo, &job.MatchedMoreThan, &cursor, &upto)
		if errors.Is(err, pgx.ErrNoRows) {
			return Job{}, errLeaseLost
		}
		if err != nil {
			return Job{}, fmt.Errorf("outbox: job %s: %w", id, err)
		}
		if err := json.Unmarshal(filter, &job.Filter); err != nil {
			return Job{}, fmt.Errorf("outbox: job %s: unreadable filter: %w", id, err)
		}
		if job.CancelRequested {
			return r.finish(ctx, tx, id, JobCancelled, nil, 0, 0)
		}
		if upto == nil { // nothing matched at creation
			return r.finish(ctx, tx, id, JobDone, nil, 0, 0)
		}
		a, err := kindAction(job.Kind)
		if err != nil {
			return Job{}, err
		}
		args := pgx.NamedArgs{"limit": job.ChunkSize, "upto": upto}
		where, err := jobWhere(a, job.Filter, args)
		if err != nil {
			return Job{}, err
		}
		if cursor != nil {
			where += "\n\t   AND e.id > @cursor"
			args["cursor"] = *cursor
		}
		// The chunk's events, locked in id order (as every locker of
		// outbox rows locks them, so no deadlock). A relay's claim skips
		// them (SKIP LOCKED) and takes other events meanwhile.
		rows, err := tx.Query(ctx, `SELECT e.id FROM outbox_event e WHERE `+where+` AND e.id <= @upto
			ORDER BY e.id LIMIT @limit FOR UPDATE OF e`, args)
		if err != nil {
			return Job{}, fmt.Errorf("outbox: job %s: select chunk: %w", id, err)
		}
		walked, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			return Job{}, fmt.Errorf("outbox: job %s: select chunk: %w", id, err)
		}
		if len(walked) == 0 {
			return r.finish(ctx, tx, id, JobDone, cursor, 0, 0)
		}
		rows, err = tx.Query(ctx, a.updateSQL(`id = ANY(@ids)`, `u.id`),
			pgx.NamedArgs{"ids": walked, "from": a.from, "reason": job.Reason, "replay_to": replayTo(job)})
		if err != nil {
			return Job{}, fmt.Errorf("outbox: job %s: %s: %w", id, a.name, err)
		}
		changed, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			return Job{}, fmt.Errorf("outbox: job %s: %s: %w", id, a.name, err)
		}
		if len(changed) > 0 && r.cfg.Hook != nil {
			if err := r.cfg.Hook(ctx, tx, job, changed); err != nil {
				return Job{}, fmt.Errorf("outbox: job %s: hook: %w", id, err)
			}
		}
		last := walked[len(walked)-1]
		if len(walked) < job.ChunkSize || last == *upto {
			return r.finish(ctx, tx, id, JobDone, &last, len(changed), len(walked)-len(changed))
		}
		return scanJob(tx.QueryRow(ctx, `
			UPDATE outbox_job
			   SET cursor_id = @cursor, done = done + @done, skipped = skipped + @skipped, failures = 0,
			       locked_until = coalesce(@now::timestamptz, clock_timestamp()) + @lease::bigint * interval '1 microsecond',
			       updated_at = now()
			 WHERE id = @id
			RETURNING `+jobColumns,
			pgx.NamedArgs{"cursor": last, "done": len(changed), "skipped": len(walked) - len(changed),
				"now": r.nowArg(), "lease": r.cfg.Lease.Microseconds(), "id": id}))
	})
}

// finish ends a job in the chunk's transaction, with OnEnd.
func (r *JobRunner) finish(ctx context.Context, tx pgx.Tx, id uuid.UUID, state string, cursor *uuid.UUID, done, skipped int) (Job, error) {
	j, err := finishJob(ctx, tx, id, state, cursor, done, skipped)
	if err == nil && r.cfg.OnEnd != nil {
		if err = r.cfg.OnEnd(ctx, tx, j); err != nil {
			err = fmt.Errorf("outbox: job %s: end hook: %w", id, err)
		}
	}
	return j, err
}

// finishJob ends a job in the chunk's transaction.
func finishJob(ctx context.Context, tx pgx.Tx, id uuid.UUID, state string, cursor *uuid.UUID, done, skipped int) (Job, error) {
	j, err := scanJob(tx.QueryRow(ctx, `
		UPDATE outbox_job
		   SET state = @state, cursor_id = coalesce(@cursor, cursor_id), done = done + @done, skipped = skipped + @skipped,
		       failures = 0, finished_at = now(), updated_at = now(), locked_until = NULL, lock_token = NULL
		 WHERE id = @id
		RETURNING `+jobColumns,
		pgx.NamedArgs{"state": state, "cursor": cursor, "done": done, "skipped": skipped, "id": id}))
	if err != nil {
		return Job{}, fmt.Errorf("outbox: finish job %s: %w", id, err)
	}
	return j, nil
}

// replayTo is a replay job's consumer as the replay_to column stores it.
func replayTo(j Job) *string {
	if j.ReplayTo == "" {
		return nil
	}
	return &j.ReplayTo
}

// CountPublishedBefore counts the events a replay of filter f would
// publish again that were last published before t: with t = now minus the
// inbox's retention, those an inbox may no longer remember (it prunes ids
// past its retention), so a consumer may apply them again. It counts up to
// JobCountExactBelow, as Preview does.
func CountPublishedBefore(ctx context.Context, q db.Querier, f Filter, t time.Time) (Total, error) {
	args := pgx.NamedArgs{"before": t}
	where, err := jobWhere(actReplay, f, args)
	if err != nil {
		return Total{}, err
	}
	n, err := db.CountUpTo(ctx, q, "outbox_event e WHERE "+where+" AND e.published_at < @before", args, JobCountExactBelow)
	if err != nil {
		return Total{}, fmt.Errorf("outbox: count published before %s: %w", t, err)
	}
	return n, nil
}
