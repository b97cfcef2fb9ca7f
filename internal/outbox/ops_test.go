package outbox_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// fixture sets one event per state the operator functions care about.
type fixture struct {
	idle, inFlight, backingOff, published, dead, missing uuid.UUID
}

func newFixture(t *testing.T, pool *pgxpool.Pool) fixture {
	t.Helper()
	ev := bulkInsert(t, pool, "ops", 5, 1)
	f := fixture{idle: ev[0].ID, inFlight: ev[1].ID, backingOff: ev[2].ID, published: ev[3].ID, dead: ev[4].ID, missing: uuid.Must(uuid.NewV7())}
	_, err := pool.Exec(context.Background(), `
		UPDATE outbox_event SET
		  locked_until = CASE id WHEN $1 THEN now() + interval '1 hour' END,
		  lock_token   = CASE id WHEN $1 THEN gen_random_uuid() END,
		  available_at = CASE id WHEN $2 THEN now() + interval '1 hour' ELSE available_at END,
		  attempts     = CASE id WHEN $2 THEN 3 WHEN $4 THEN 10 ELSE attempts END,
		  status       = CASE id WHEN $3 THEN 'published' WHEN $4 THEN 'dead' ELSE status END,
		  published_at = CASE id WHEN $3 THEN now() END,
		  dead_at      = CASE id WHEN $4 THEN now() END,
		  dead_reason  = CASE id WHEN $4 THEN 'max attempts reached (10)' END,
		  last_error   = CASE id WHEN $2 THEN 'timeout' WHEN $4 THEN 'rejected' END`,
		f.inFlight, f.backingOff, f.published, f.dead)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func sorted(ids []uuid.UUID) []uuid.UUID {
	out := slices.Clone(ids)
	slices.SortFunc(out, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	return out
}

func TestRetryAndDeadLetterAreCompareAndSet(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	f := newFixture(t, pool)
	all := []uuid.UUID{f.idle, f.inFlight, f.backingOff, f.published, f.dead, f.missing}
	before := statusCounts(t, pool)

	// DeadLetter: only pending events no relay holds.
	changed, err := outbox.DeadLetter(ctx, pool, all, "operator: bad payload")
	if err != nil {
		t.Fatal(err)
	}
	if want := sorted([]uuid.UUID{f.idle, f.backingOff}); !slices.Equal(sorted(changed), want) {
		t.Fatalf("DeadLetter changed %v, want %v", changed, want)
	}
	if un := outbox.Unchanged(all, changed); !slices.Equal(un, []uuid.UUID{f.inFlight, f.published, f.dead, f.missing}) {
		t.Fatalf("Unchanged = %v", un)
	}
	row, _ := outbox.Get(ctx, pool, f.idle)
	if row.Status != outbox.StatusDead || row.DeadReason == nil || *row.DeadReason != "operator: bad payload" || row.DeadAt == nil {
		t.Fatalf("dead-lettered row = %+v", row)
	}
	// Acting again on the same rows changes nothing and says so.
	if again, err := outbox.DeadLetter(ctx, pool, []uuid.UUID{f.idle, f.published}, "again"); err != nil || len(again) != 0 {
		t.Fatalf("second DeadLetter changed %v (%v), want nothing", again, err)
	}
	if _, err := outbox.DeadLetter(ctx, pool, all, ""); err == nil {
		t.Fatal("DeadLetter without a reason succeeded")
	}

	// Retry: dead and idle pending come back now; published, in-flight and
	// missing do not.
	changed, err = outbox.Retry(ctx, pool, all)
	if err != nil {
		t.Fatal(err)
	}
	if want := sorted([]uuid.UUID{f.idle, f.backingOff, f.dead}); !slices.Equal(sorted(changed), want) {
		t.Fatalf("Retry changed %v, want %v", changed, want)
	}
	for _, id := range changed {
		row, _ := outbox.Get(ctx, pool, id)
		if row.Status != outbox.StatusPending || row.Attempts != 0 || row.DeadAt != nil || row.LockedUntil != nil || row.AvailableAt.After(time.Now().Add(time.Second)) {
			t.Fatalf("retried row = %+v", row)
		}
	}
	if row, _ := outbox.Get(ctx, pool, f.dead); row.LastError == nil || *row.LastError != "rejected" {
		t.Fatalf("retry dropped the last error history: %v", row.LastError)
	}
	if row, _ := outbox.Get(ctx, pool, f.published); row.Status != outbox.StatusPublished {
		t.Fatalf("published row became %s", row.Status)
	}
	if row, _ := outbox.Get(ctx, pool, f.inFlight); row.LockedUntil == nil {
		t.Fatal("retry broke a live lease")
	}
	if c := statusCounts(t, pool); c[outbox.StatusPublished] != before[outbox.StatusPublished] {
		t.Fatalf("statuses %v", c)
	}
	if _, err := outbox.Get(ctx, pool, f.missing); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Get(missing) = %v, want ErrNotFound", err)
	}
}

// Of many operators dead-lettering one event at once, exactly one changes
// it; inside a caller's transaction the action rolls back with it.
func TestOperatorActionsRaceAndFollowTheCallersTransaction(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	id := bulkInsert(t, pool, "race", 1, 1)[0].ID

	const operators = 12
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		wins int
	)
	start := make(chan struct{})
	for range operators {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			changed, err := outbox.DeadLetter(ctx, pool, []uuid.UUID{id}, "race")
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			wins += len(changed)
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	if wins != 1 {
		t.Fatalf("%d operators changed the event, want exactly 1", wins)
	}

	rollback := errors.New("audit insert failed")
	err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		changed, err := outbox.Retry(ctx, tx, []uuid.UUID{id})
		if err != nil || len(changed) != 1 {
			t.Fatalf("Retry in tx changed %v (%v)", changed, err)
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatal(err)
	}
	if row, _ := outbox.Get(ctx, pool, id); row.Status != outbox.StatusDead {
		t.Fatalf("status %s after the caller rolled back, want dead", row.Status)
	}
}

func TestPruneNeverRemovesPendingOrDead(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	bulkInsert(t, pool, "p", 100, 1)
	now := time.Now()
	const retention = 7 * 24 * time.Hour
	// 50 published long ago, 20 published just inside the window, 10
	// pending and 10 dead created long ago, 10 pending recent.
	_, err := pool.Exec(ctx, `
		WITH numbered AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM outbox_event)
		UPDATE outbox_event e SET
		  status = CASE WHEN n <= 70 THEN 'published' WHEN n <= 80 THEN 'pending' WHEN n <= 90 THEN 'dead' ELSE 'pending' END,
		  published_at = CASE WHEN n <= 50 THEN $1::timestamptz - interval '8 days'
		                      WHEN n <= 70 THEN $1::timestamptz - interval '7 days' + interval '1 minute' END,
		  created_at = CASE WHEN n <= 90 THEN $1::timestamptz - interval '30 days' ELSE created_at END,
		  dead_at = CASE WHEN n > 80 AND n <= 90 THEN $1::timestamptz - interval '29 days' END
		FROM numbered WHERE numbered.id = e.id`, now)
	if err != nil {
		t.Fatal(err)
	}
	deleted, err := outbox.Prune(ctx, pool, retention, 7, now)
	if err != nil {
		t.Fatal(err)
	}
	if deleted != 50 {
		t.Fatalf("pruned %d, want the 50 published rows past retention", deleted)
	}
	c := statusCounts(t, pool)
	if c[outbox.StatusPublished] != 20 || c[outbox.StatusPending] != 20 || c[outbox.StatusDead] != 10 {
		t.Fatalf("left %v, want 20 published (inside the window), 20 pending, 10 dead", c)
	}
	if n, err := outbox.Prune(ctx, pool, retention, 7, now); err != nil || n != 0 {
		t.Fatalf("second prune deleted %d (%v)", n, err)
	}
	if _, err := outbox.Prune(ctx, pool, retention, db.MaxDeleteBatch+1, now); err == nil {
		t.Fatal("an oversized prune batch was accepted")
	}
}

func TestBacklogCounts(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	newFixture(t, pool) // idle, in flight, backing off, published, dead
	b, err := outbox.ReadBacklog(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	// Pending is every pending row, the one in flight included: the one
	// definition the dashboard and sluice_outbox_backlog share.
	if b.Pending != 3 || b.InFlight != 1 || b.Dead != 1 || b.OldestPendingAge <= 0 || len(b.Topics) == 0 {
		t.Fatalf("backlog %+v, want 3 pending (1 of them in flight), 1 dead, an oldest age", b)
	}
}

// With a poll interval of an hour, only a NOTIFY can wake the relay.
func TestNotifierWakesAnIdleRelay(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := &pubLog{}
	r, err := outbox.NewRelay(pool, &memPublisher{name: "r", log: log}, outbox.RelayConfig{PollInterval: time.Hour}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	n := outbox.NewNotifier(pool, 10*time.Millisecond, nil)
	go func() { _ = n.Run(ctx) }()

	// The relay's first (empty) claim has run and its listener is up once
	// pg_stat_activity shows a session waiting in LISTEN.
	waitFor(t, "relay listening", func() bool {
		var listening bool
		_ = pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND query IN ('LISTEN sluice_outbox', 'LISTEN "sluice_outbox"'))`).Scan(&listening)
		return listening && r.Stats().Claimed == 0
	})
	bulkInsert(t, pool, "wake", 3, 1)
	// Keep poking: a notification sent before LISTEN took effect is lost
	// (that is what polling is for), a later one is not.
	waitFor(t, "relay woken by NOTIFY", func() bool {
		n.Poke()
		return len(log.all()) == 3
	})
	cancel()
	<-done
}
