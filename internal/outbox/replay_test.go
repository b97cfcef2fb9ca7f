package outbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// seedPublished writes n published events of topic, published age ago.
func seedPublished(t *testing.T, pool *pgxpool.Pool, topic string, n int, age time.Duration) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, published_at, attempts)
		SELECT (lpad(to_hex($3::bigint + g), 12, '0') || '7' || substr(md5($2 || g), 1, 3) || '8' || substr(md5($2 || g), 4, 15))::uuid,
		       'replay', $2 || '-' || (g % 100), (g - 1) / 100 + 1, $2, 'replay.v1', '{}'::jsonb, 'published', now() - $4::interval, 1
		  FROM generate_series(1, $1) g`, n, topic, time.Now().Add(-2*time.Hour).UnixMilli(), age.String())
	if err != nil {
		t.Fatal(err)
	}
}

// A replay job makes published events pending again with their replay
// counted and its consumer named; it survives its runner dying mid-job
// (another runner finishes it, no event replayed twice); the relay then
// publishes every event once more with its original id and marks it
// published again. A dry run counts exactly, and says how many events were
// published before a given time (an inbox's retention).
func TestReplayJobSurvivesARunnerRestartAndRelaysRepublish(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	const n = 5000
	seedPublished(t, pool, "orders", n, time.Hour)
	seedPublished(t, pool, "other", 10, time.Hour)
	// The events of one aggregate were published long ago.
	if _, err := pool.Exec(ctx, `UPDATE outbox_event SET published_at = now() - interval '30 days' WHERE aggregate_id = 'orders-7'`); err != nil {
		t.Fatal(err)
	}
	f := outbox.Filter{Topic: "orders"}
	p, err := outbox.Preview(ctx, pool, outbox.JobReplay, f, 5)
	if err != nil || p.Count != (outbox.Total{N: n}) || len(p.Sample) != 5 {
		t.Fatalf("dry run %+v, %v", p, err)
	}
	old, err := outbox.CountPublishedBefore(ctx, pool, f, time.Now().Add(-7*24*time.Hour))
	if err != nil || old != (outbox.Total{N: n / 100}) {
		t.Fatalf("%+v published before the retention (%v), want %d", old, err, n/100)
	}
	if _, err := outbox.Preview(ctx, pool, outbox.JobReplay, outbox.Filter{Status: outbox.StatusDead}, 5); !errors.Is(err, outbox.ErrInvalidFilter) {
		t.Fatalf("replay of dead events: %v", err)
	}
	if _, err := outbox.CreateJob(ctx, mustTx(t, pool), outbox.JobRequest{Kind: outbox.JobReplay, Filter: f, RequestedBy: "ann"}); !errors.Is(err, outbox.ErrInvalidAction) {
		t.Fatalf("replay without reason: %v", err)
	}
	if _, err := outbox.CreateJob(ctx, mustTx(t, pool), outbox.JobRequest{Kind: outbox.JobReplay, Filter: f, RequestedBy: "ann",
		Reason: "x", ReplayTo: "no spaces allowed"}); !errors.Is(err, outbox.ErrInvalidAction) {
		t.Fatalf("replay to an impossible consumer name: %v", err)
	}
	hook := recorder(pool, t)
	job := createJob(t, pool, outbox.JobRequest{Kind: outbox.JobReplay, Filter: f, RequestedBy: "ann", Reason: "billing lost its data",
		ReplayTo: "billing", ChunkSize: 500})
	if job.Matched != n || job.MatchedMoreThan != 0 || job.ReplayTo != "billing" {
		t.Fatalf("job %+v", job)
	}

	// The first runner (a console) stops in its fourth chunk.
	stopCtx, stop := context.WithCancel(ctx)
	var chunks atomic.Int64
	first, err := outbox.NewJobRunner(pool, outbox.JobRunnerConfig{
		Hook: func(ctx context.Context, tx pgx.Tx, j outbox.Job, ids []uuid.UUID) error {
			if chunks.Add(1) == 4 {
				stop()
				return ctx.Err()
			}
			return hook(ctx, tx, j, ids)
		},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ran, err := first.RunOnce(stopCtx); !ran || err != nil {
		t.Fatalf("first runner: %v %v", ran, err)
	}
	mid, err := outbox.GetJob(ctx, pool, job.ID)
	if err != nil || mid.State != outbox.JobRunning || mid.Done != 1500 {
		t.Fatalf("after the stop: %+v (%v), want running with 3 chunks done", mid, err)
	}
	second, err := outbox.NewJobRunner(pool, outbox.JobRunnerConfig{Hook: hook}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ran, err := second.RunOnce(ctx); !ran || err != nil {
		t.Fatalf("second runner: %v %v", ran, err)
	}
	end, err := outbox.GetJob(ctx, pool, job.ID)
	if err != nil || end.State != outbox.JobDone || end.Done != n || end.Skipped != 0 {
		t.Fatalf("job %+v (%v), want done with %d", end, err, n)
	}
	var pending, wrong int
	if err := pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE status = 'pending' AND topic = 'orders'),
		       count(*) FILTER (WHERE (topic = 'orders') <> (status = 'pending' AND replay_count = 1 AND replay_to = 'billing' AND replayed_at IS NOT NULL))
		  FROM outbox_event`).Scan(&pending, &wrong); err != nil || pending != n || wrong != 0 {
		t.Fatalf("%d pending, %d rows not replayed as asked (%v)", pending, wrong, err)
	}

	// The relay publishes each once more, with its id, the replay count and
	// its consumer, in order per aggregate, and marks it published again.
	log := &pubLog{}
	r, err := outbox.NewRelay(pool, &memPublisher{name: "r", log: log}, outbox.RelayConfig{BatchSize: 200, PollInterval: 10 * time.Millisecond}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(rctx) }()
	testkit.Until(t, "the replay published", func() bool { return statusCounts(t, pool)[outbox.StatusPending] == 0 })
	cancel()
	<-done
	got := log.all()
	if len(got) != n {
		t.Fatalf("%d messages published, want %d", len(got), n)
	}
	seen := map[string]bool{}
	for _, m := range got {
		if m.Msg.Replay != 1 || m.Msg.ReplayTo != "billing" || m.Msg.Topic != "orders" || seen[m.Msg.ID] {
			t.Fatalf("message %+v: want each id once, replay 1 to billing", m.Msg)
		}
		seen[m.Msg.ID] = true
	}
	assertOrderPerAggregate(t, got)
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE replay_to IS NOT NULL OR status <> 'published'`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d events not published again or still naming their consumer (%v)", left, err)
	}
}

func mustTx(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// A replay's dry run, the confirming job and the count past the inbox's
// retention read at most the cap of published events, never a topic's
// whole history (50,000 events here): past the cap they say "more than"
// it, with the planner's estimate. The transaction's table statistics show
// what each read.
func TestReplayCountsStopAtTheCap(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	const n = 50_000
	seedPublished(t, pool, "orders", n, 30*24*time.Hour)
	if _, err := pool.Exec(ctx, `ANALYZE outbox_event`); err != nil {
		t.Fatal(err)
	}
	f := outbox.Filter{Topic: "orders"}
	// The cap plus one, the sample, and a few the planner reads at an
	// index's ends.
	const most = outbox.JobCountExactBelow + 1 + 5 + 50
	tx := mustTx(t, pool)
	read := func() int64 {
		var n int64
		if err := tx.QueryRow(ctx, `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
			  FROM pg_stat_xact_user_tables WHERE relname = 'outbox_event'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := read()
	p, err := outbox.Preview(ctx, tx, outbox.JobReplay, f, 5)
	if err != nil {
		t.Fatal(err)
	}
	if p.Count.MoreThan != outbox.JobCountExactBelow || p.Count.N <= outbox.JobCountExactBelow || len(p.Sample) != 5 {
		t.Fatalf("dry run %+v, want more than %d", p, outbox.JobCountExactBelow)
	}
	if r := read() - before; r > most {
		t.Fatalf("the dry run read %d events, want at most %d", r, most)
	}
	before = read()
	old, err := outbox.CountPublishedBefore(ctx, tx, f, time.Now().Add(-7*24*time.Hour))
	if err != nil || old.MoreThan != outbox.JobCountExactBelow {
		t.Fatalf("published before the retention: %+v (%v)", old, err)
	}
	if r := read() - before; r > most {
		t.Fatalf("the count past the retention read %d events, want at most %d", r, most)
	}
	before = read()
	j, err := outbox.CreateJob(ctx, tx, outbox.JobRequest{Kind: outbox.JobReplay, Filter: f, RequestedBy: "ann", Reason: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if j.MatchedMoreThan != outbox.JobCountExactBelow || j.MatchedTotal().Counted() != p.Count.Counted() || j.State != outbox.JobPending {
		t.Fatalf("job %+v, want more than %d matched, as the dry run said", j, outbox.JobCountExactBelow)
	}
	if r := read() - before; r > most {
		t.Fatalf("creating the job read %d events, want at most %d", r, most)
	}
}
