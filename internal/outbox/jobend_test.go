package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// OnEnd runs once per job, in the transaction that ends it, whether the job
// is done, cancelled or failed; an OnEnd that fails rolls the ending back.
func TestEndHookRunsOnceInTheEndingTransaction(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE job_end (job uuid PRIMARY KEY, state text NOT NULL, done bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	refuse := true
	onEnd := func(ctx context.Context, tx pgx.Tx, j outbox.Job) error {
		if _, err := tx.Exec(ctx, `INSERT INTO job_end VALUES ($1, $2, $3)`, j.ID, j.State, j.Done); err != nil {
			return err
		}
		if refuse && j.State == outbox.JobDone {
			refuse = false
			return errors.New("audit unavailable")
		}
		return nil
	}
	ended := func(id uuid.UUID) (state string, done int64, n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT coalesce(max(state), ''), coalesce(max(done), 0), count(*) FROM job_end WHERE job = $1`, id).Scan(&state, &done, &n); err != nil {
			t.Fatal(err)
		}
		return state, done, n
	}

	// Done: the first ending is refused (rolled back with its hook row),
	// the retry ends it once.
	seedDead(t, pool, "done", 25)
	job := createJob(t, pool, outbox.JobRequest{Kind: outbox.JobRetry, Filter: outbox.Filter{Topic: "done"}, RequestedBy: "op", ChunkSize: 10})
	r, err := outbox.NewJobRunner(pool, outbox.JobRunnerConfig{OnEnd: onEnd, RetryDelay: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ran, err := r.RunOnce(ctx); !ran || err == nil {
		t.Fatalf("a refused ending: ran %v, %v; want the chunk's error", ran, err)
	}
	if j, _ := outbox.GetJob(ctx, pool, job.ID); j.State != outbox.JobRunning || j.Done != 20 {
		t.Fatalf("after a refused ending: %+v, want running with 20 done", j)
	}
	if _, _, n := ended(job.ID); n != 0 {
		t.Fatalf("a rolled-back ending left %d hook rows", n)
	}
	for ran := true; ran; {
		if ran, err = r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if state, done, n := ended(job.ID); state != outbox.JobDone || done != 25 || n != 1 {
		t.Fatalf("ending %q with %d done, %d rows; want done, 25, once", state, done, n)
	}

	// Cancelled: asked between chunks, the next chunk ends it.
	seedDead(t, pool, "cancel", 30)
	job = createJob(t, pool, outbox.JobRequest{Kind: outbox.JobDiscard, Reason: "r", Filter: outbox.Filter{Topic: "cancel"}, RequestedBy: "op", ChunkSize: 10})
	r2, err := outbox.NewJobRunner(pool, outbox.JobRunnerConfig{OnEnd: onEnd, Hook: func(ctx context.Context, tx pgx.Tx, j outbox.Job, ids []uuid.UUID) error {
		_, err := tx.Exec(ctx, `UPDATE outbox_job SET cancel_requested_at = now() WHERE id = $1`, j.ID)
		return err
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ran, err := r2.RunOnce(ctx); !ran || err != nil {
		t.Fatalf("ran %v, %v", ran, err)
	}
	if state, done, n := ended(job.ID); state != outbox.JobCancelled || done != 10 || n != 1 {
		t.Fatalf("ending %q with %d done, %d rows; want cancelled after one chunk, once", state, done, n)
	}

	// Failed: every chunk fails; the release that fails the job ends it.
	seedDead(t, pool, "fail", 5)
	job = createJob(t, pool, outbox.JobRequest{Kind: outbox.JobRetry, Filter: outbox.Filter{Topic: "fail"}, RequestedBy: "op"})
	r3, err := outbox.NewJobRunner(pool, outbox.JobRunnerConfig{OnEnd: onEnd, MaxFailures: 2, RetryDelay: 1,
		Hook: func(context.Context, pgx.Tx, outbox.Job, []uuid.UUID) error { return errors.New("broken") }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := db.WithTxV(ctx, pool, func(tx pgx.Tx) (int, error) {
			// The retry delay has passed: make the job runnable at once.
			_, err := tx.Exec(ctx, `UPDATE outbox_job SET locked_until = NULL WHERE id = $1`, job.ID)
			return 0, err
		}); err != nil {
			t.Fatal(err)
		}
		if ran, err := r3.RunOnce(ctx); !ran || err == nil {
			t.Fatalf("a failing chunk: ran %v, %v", ran, err)
		}
	}
	if state, done, n := ended(job.ID); state != outbox.JobFailed || done != 0 || n != 1 {
		t.Fatalf("ending %q with %d done, %d rows; want failed, once", state, done, n)
	}
	if j, _ := outbox.GetJob(ctx, pool, job.ID); j.State != outbox.JobFailed {
		t.Fatalf("job %+v, want failed", j)
	}
}
