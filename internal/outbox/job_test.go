package outbox_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// seedDead writes n dead events (one per aggregate, so none holds another)
// on topic with COPY.
func seedDead(t *testing.T, pool *pgxpool.Pool, topic string, n int) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, dead_at, dead_reason, attempts)
		SELECT (lpad(to_hex($3::bigint + g), 12, '0') || '7' || substr(md5($2 || g), 1, 3) || '8' || substr(md5($2 || g), 4, 15))::uuid,
		       'job', $2 || '-' || g, 1, $2, 'job.v1', '{}'::jsonb, 'dead', now(), 'max attempts reached (10)', 10
		  FROM generate_series(1, $1) g`, n, topic, time.Now().Add(-time.Hour).UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
}

func createJob(t *testing.T, pool *pgxpool.Pool, req outbox.JobRequest) outbox.Job {
	t.Helper()
	j, err := db.WithTxV(context.Background(), pool, func(tx pgx.Tx) (outbox.Job, error) { return outbox.CreateJob(context.Background(), tx, req) })
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// recorder is a chunk hook that writes the chunk's ids in the chunk's
// transaction (as the console writes its audit row): a primary key proves no
// id is done twice, and a rolled-back chunk leaves no trace.
func recorder(pool *pgxpool.Pool, t *testing.T) outbox.ChunkHook {
	if _, err := pool.Exec(context.Background(), `CREATE TABLE job_done (id uuid PRIMARY KEY, job uuid NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return func(ctx context.Context, tx pgx.Tx, job outbox.Job, ids []uuid.UUID) error {
		_, err := tx.Exec(ctx, `INSERT INTO job_done (id, job) SELECT unnest($1::uuid[]), $2`, ids, job.ID)
		return err
	}
}

func TestPreviewChangesNothing(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	seedDead(t, pool, "a", 30)
	seedDead(t, pool, "b", 5)
	before := statusCounts(t, pool)
	p, err := outbox.Preview(ctx, pool, outbox.JobRetry, outbox.Filter{Topic: "a"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if p.Count != (outbox.Total{N: 30}) || len(p.Sample) != 10 {
		t.Fatalf("preview %+v, %d samples; want 30 and 10", p.Count, len(p.Sample))
	}
	if p, err := outbox.Preview(ctx, pool, outbox.JobDeadLetter, outbox.Filter{Topic: "a"}, 10); err != nil || p.Count != (outbox.Total{}) {
		t.Fatalf("dead-letter preview of dead events: %+v (%v), want 0", p, err)
	}
	if _, err := outbox.Preview(ctx, pool, outbox.JobRetry, outbox.Filter{Status: outbox.StatusPending}, 10); !errors.Is(err, outbox.ErrInvalidFilter) {
		t.Fatalf("retry of pending events: %v, want ErrInvalidFilter", err)
	}
	if c := statusCounts(t, pool); c[outbox.StatusDead] != before[outbox.StatusDead] || c[outbox.StatusPending] != 0 {
		t.Fatalf("a dry run changed statuses: %v", c)
	}
	var jobs int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_job`).Scan(&jobs); err != nil || jobs != 0 {
		t.Fatalf("a dry run made %d jobs (%v)", jobs, err)
	}
	// A job needs a reason to dead-letter or discard, and a requester.
	for _, req := range []outbox.JobRequest{
		{Kind: outbox.JobDiscard, RequestedBy: "op"},
		{Kind: outbox.JobRetry},
		{Kind: "delete", RequestedBy: "op"},
		{Kind: outbox.JobRetry, RequestedBy: "op", ChunkSize: outbox.MaxJobChunk + 1},
	} {
		_, err := db.WithTxV(ctx, pool, func(tx pgx.Tx) (outbox.Job, error) { return outbox.CreateJob(ctx, tx, req) })
		if !errors.Is(err, outbox.ErrInvalidAction) {
			t.Errorf("job %+v: %v, want ErrInvalidAction", req, err)
		}
	}
}

// A bulk retry of 100,000 dead events runs in chunks, survives its runner
// dying in the middle of a chunk (the chunk's transaction rolls back) and a
// new runner finishes it: every event is retried exactly once (the hook's
// ids, under a primary key), none is skipped.
func TestBulkRetrySurvivesARunnerDyingMidChunk(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	const n = 100_000
	seedDead(t, pool, "bulk", n)
	seedDead(t, pool, "other", 10) // not in the filter
	hook := recorder(pool, t)
	job := createJob(t, pool, outbox.JobRequest{Kind: outbox.JobRetry, Filter: outbox.Filter{Topic: "bulk"}, RequestedBy: "iss|oncall", ChunkSize: 1000})
	// Past the cap, the job says more than the cap matched.
	if job.MatchedMoreThan != outbox.JobCountExactBelow || job.Matched <= outbox.JobCountExactBelow || job.State != outbox.JobPending {
		t.Fatalf("job %+v, want more than %d matched, pending", job, outbox.JobCountExactBelow)
	}

	// The first runner dies in its 40th chunk, inside the transaction.
	dieCtx, die := context.WithCancel(ctx)
	var chunks atomic.Int64
	var progress []outbox.Job
	first, err := outbox.NewJobRunner(pool, outbox.JobRunnerConfig{
		Hook: func(ctx context.Context, tx pgx.Tx, job outbox.Job, ids []uuid.UUID) error {
			if chunks.Add(1) == 40 {
				die()
				return ctx.Err()
			}
			return hook(ctx, tx, job, ids)
		},
		OnProgress: func(j outbox.Job) { progress = append(progress, j) },
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ran, err := first.RunOnce(dieCtx); !ran || err != nil {
		t.Fatalf("first runner: ran %v, %v", ran, err)
	}
	mid, err := outbox.GetJob(ctx, pool, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if mid.State != outbox.JobRunning || mid.Done != 39*1000 || len(progress) < 39 {
		t.Fatalf("after the crash: %+v (%d progress calls), want running with 39 chunks done", mid, len(progress))
	}
	var recorded int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM job_done`).Scan(&recorded); err != nil || recorded != 39*1000 {
		t.Fatalf("%d ids recorded after the crash (%v), want the 39 committed chunks", recorded, err)
	}

	second, err := outbox.NewJobRunner(pool, outbox.JobRunnerConfig{Hook: hook}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ran, err := second.RunOnce(ctx); !ran || err != nil {
		t.Fatalf("second runner: ran %v, %v", ran, err)
	}
	end, err := outbox.GetJob(ctx, pool, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if end.State != outbox.JobDone || end.Done != n || end.Skipped != 0 || end.FinishedAt == nil {
		t.Fatalf("job %+v, want done with %d", end, n)
	}
	var missing, extra int
	err = pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM outbox_event e WHERE e.topic = 'bulk' AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.id = e.id)),
		       (SELECT count(*) FROM job_done d JOIN outbox_event e USING (id) WHERE e.topic <> 'bulk')`).Scan(&missing, &extra)
	if err != nil || missing != 0 || extra != 0 {
		t.Fatalf("%d events never retried, %d retried outside the filter (%v)", missing, extra, err)
	}
	if c := statusCounts(t, pool); c[outbox.StatusPending] != n || c[outbox.StatusDead] != 10 {
		t.Fatalf("statuses %v, want %d pending and the 10 others still dead", c, n)
	}
}

// A runner that crashed without giving its job back holds it until the
// lease expires; then another runner takes over where it stopped.
func TestAnExpiredJobLeaseIsTakenOver(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	seedDead(t, pool, "t", 50)
	hook := recorder(pool, t)
	job := createJob(t, pool, outbox.JobRequest{Kind: outbox.JobDiscard, Reason: "bad batch", RequestedBy: "op", ChunkSize: 10})
	// As a crashed runner leaves it: running, someone else's live lease.
	if _, err := pool.Exec(ctx, `UPDATE outbox_job SET state = 'running', lock_token = gen_random_uuid(), locked_until = now() + interval '1 minute' WHERE id = $1`, job.ID); err != nil {
		t.Fatal(err)
	}
	clk := testkit.NewClock(time.Now())
	r, err := outbox.NewJobRunner(pool, outbox.JobRunnerConfig{Hook: hook, Now: clk.Now}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ran, err := r.RunOnce(ctx); ran || err != nil {
		t.Fatalf("took a job under a live lease (ran %v, %v)", ran, err)
	}
	clk.Advance(2 * time.Minute)
	if ran, err := r.RunOnce(ctx); !ran || err != nil {
		t.Fatalf("did not take over the expired lease (ran %v, %v)", ran, err)
	}
	if j, _ := outbox.GetJob(ctx, pool, job.ID); j.State != outbox.JobDone || j.Done != 50 {
		t.Fatalf("job %+v", j)
	}
	if c := statusCounts(t, pool); c[outbox.StatusDiscarded] != 50 {
		t.Fatalf("statuses %v", c)
	}
}

// A cancel stops a job before its next chunk; a relay keeps publishing other
// events while a job runs (a chunk waits until the relay has published, so a
// job that blocked the relay would never finish).
func TestJobCancelAndRelayKeepsPublishing(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seedDead(t, pool, "d", 500)
	bulkInsert(t, pool, "flow", 50, 4) // other events, pending
	log := &pubLog{}
	relay, err := outbox.NewRelay(pool, &memPublisher{name: "r", log: log}, outbox.RelayConfig{BatchSize: 10, DisableListen: true, PollInterval: 5 * time.Millisecond}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	job := createJob(t, pool, outbox.JobRequest{Kind: outbox.JobDiscard, Reason: "r", RequestedBy: "op", ChunkSize: 100})
	var chunk atomic.Int64
	r, err := outbox.NewJobRunner(pool, outbox.JobRunnerConfig{Hook: func(ctx context.Context, tx pgx.Tx, j outbox.Job, ids []uuid.UUID) error {
		switch chunk.Add(1) {
		case 1:
			// Inside the chunk's transaction, holding its 100 row locks:
			// the relay publishes meanwhile.
			wg.Go(func() { _ = relay.Run(ctx) })
			testkit.Until(t, "the relay publishing during the job", func() bool { return len(log.all()) > 0 })
		case 2:
			// A cancel asked while a chunk runs (here in the chunk's own
			// transaction, so the moment is exact: a cancel from another
			// session waits for the chunk's lock on the job row and lands
			// at the same point) lets the chunk finish and stops the job
			// before the next one.
			if _, err := outbox.CancelJob(ctx, tx, j.ID); err != nil {
				return err
			}
		}
		return nil
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ran, err := r.RunOnce(ctx); !ran || err != nil {
		t.Fatalf("ran %v, %v", ran, err)
	}
	j, err := outbox.GetJob(ctx, pool, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != outbox.JobCancelled || j.Done != 200 || !j.CancelRequested {
		t.Fatalf("job %+v, want cancelled after 2 chunks", j)
	}
	if c := statusCounts(t, pool); c[outbox.StatusDiscarded] != 200 || c[outbox.StatusDead] != 300 {
		t.Fatalf("statuses %v, want 200 discarded and 300 still dead", c)
	}
	if _, err := outbox.CancelJob(ctx, pool, job.ID); !errors.Is(err, outbox.ErrJobFinished) {
		t.Fatalf("cancel of a cancelled job: %v", err)
	}
	// A job not yet started is cancelled at once.
	queued := createJob(t, pool, outbox.JobRequest{Kind: outbox.JobRetry, RequestedBy: "op"})
	if j, err := outbox.CancelJob(ctx, pool, queued.ID); err != nil || j.State != outbox.JobCancelled {
		t.Fatalf("cancel of a queued job: %+v (%v)", j, err)
	}
	if jobs, err := outbox.ListJobs(ctx, pool, 10); err != nil || len(jobs) != 2 || jobs[0].ID != queued.ID {
		t.Fatalf("jobs %v (%v)", jobs, err)
	}
}
