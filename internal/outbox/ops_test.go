package outbox_test

import (
	"context"
	"errors"
	"reflect"
	"sync"
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
	// Statuses set by hand: recount the backlog, as whoever does it must.
	if _, _, err := outbox.RecountBacklog(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return f
}

func mustGet(t *testing.T, pool *pgxpool.Pool, id uuid.UUID) outbox.Row {
	t.Helper()
	row, err := outbox.Get(context.Background(), pool, id)
	if err != nil {
		t.Fatal(err)
	}
	return row
}

// conflictOf asserts err is a ConflictError and returns it.
func conflictOf(t *testing.T, err error) *outbox.ConflictError {
	t.Helper()
	var c *outbox.ConflictError
	if !errors.Is(err, outbox.ErrConflict) || !errors.As(err, &c) {
		t.Fatalf("err = %v, want a conflict", err)
	}
	return c
}

func TestOperatorActionsAreCompareAndSet(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	f := newFixture(t, pool)

	// DeadLetter: a pending event no relay holds.
	ch, err := outbox.DeadLetter(ctx, pool, f.idle, outbox.StatusPending, "operator: bad payload")
	if err != nil {
		t.Fatal(err)
	}
	if ch.Before.Status != outbox.StatusPending || ch.After.Status != outbox.StatusDead || ch.After.DeadReason != "operator: bad payload" {
		t.Fatalf("dead-letter change %+v", ch)
	}
	if row := mustGet(t, pool, f.idle); row.Status != outbox.StatusDead || row.DeadAt == nil {
		t.Fatalf("dead-lettered row = %+v", row)
	}
	// In flight: refused, the lease stays, the conflict says why.
	c := conflictOf(t, func() error {
		_, err := outbox.DeadLetter(ctx, pool, f.inFlight, outbox.StatusPending, "x")
		return err
	}())
	if c.Current.Status != outbox.StatusPending || !c.Current.InFlight {
		t.Fatalf("conflict %+v, want pending and in flight", c.Current)
	}
	if row := mustGet(t, pool, f.inFlight); row.LockedUntil == nil || row.Status != outbox.StatusPending {
		t.Fatal("dead-letter broke a live lease")
	}
	if _, err := outbox.RetryNow(ctx, pool, f.inFlight, outbox.StatusPending); !errors.Is(err, outbox.ErrConflict) {
		t.Fatalf("RetryNow of an in-flight event: %v, want a conflict", err)
	}
	// A stale page: the operator saw pending, the event was published since.
	before := mustGet(t, pool, f.published)
	c = conflictOf(t, func() error {
		_, err := outbox.DeadLetter(ctx, pool, f.published, outbox.StatusPending, "x")
		return err
	}())
	if c.Current.Status != outbox.StatusPublished || c.Expected != outbox.StatusPending {
		t.Fatalf("conflict %+v", c)
	}
	if after := mustGet(t, pool, f.published); !reflect.DeepEqual(before, after) {
		t.Fatalf("a refused action changed the row:\n%+v\n%+v", before, after)
	}
	if _, err := outbox.DeadLetter(ctx, pool, f.missing, outbox.StatusPending, "x"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}
	for _, err := range []error{
		func() error {
			_, err := outbox.DeadLetter(ctx, pool, f.backingOff, outbox.StatusPending, "")
			return err
		}(),
		func() error { _, err := outbox.Discard(ctx, pool, f.dead, outbox.StatusDead, ""); return err }(),
		func() error { _, err := outbox.Retry(ctx, pool, f.backingOff, outbox.StatusPending); return err }(),
		func() error { _, err := outbox.RetryNow(ctx, pool, f.dead, outbox.StatusDead); return err }(),
	} {
		if !errors.Is(err, outbox.ErrInvalidAction) {
			t.Fatalf("err = %v, want ErrInvalidAction", err)
		}
	}

	// RetryNow clears the backoff and keeps the attempts.
	ch, err = outbox.RetryNow(ctx, pool, f.backingOff, outbox.StatusPending)
	if err != nil {
		t.Fatal(err)
	}
	if !ch.After.AvailableAt.Before(ch.Before.AvailableAt) || ch.After.Attempts != 3 {
		t.Fatalf("retry-now change %+v", ch)
	}

	// Retry: dead → pending now, attempts restart, last error kept.
	ch, err = outbox.Retry(ctx, pool, f.dead, outbox.StatusDead)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Before.Status != outbox.StatusDead || ch.Before.Attempts != 10 || ch.After.Status != outbox.StatusPending || ch.After.Attempts != 0 {
		t.Fatalf("retry change %+v", ch)
	}
	row := mustGet(t, pool, f.dead)
	if row.DeadAt != nil || row.DeadReason != nil || row.LockedUntil != nil || row.LastError == nil || *row.LastError != "rejected" {
		t.Fatalf("retried row = %+v", row)
	}
	if _, err := outbox.Retry(ctx, pool, f.dead, outbox.StatusDead); conflictOf(t, err).Current.Status != outbox.StatusPending {
		t.Fatal("a second retry did not see the first")
	}

	// Discard: dead → discarded, the dead history kept beside the reason.
	ch, err = outbox.Discard(ctx, pool, f.idle, outbox.StatusDead, "duplicate of a corrected event")
	if err != nil {
		t.Fatal(err)
	}
	if ch.After.Status != outbox.StatusDiscarded || ch.After.DiscardReason != "duplicate of a corrected event" || ch.After.DeadReason != "operator: bad payload" {
		t.Fatalf("discard change %+v", ch)
	}
	if row := mustGet(t, pool, f.idle); row.DiscardedAt == nil || row.DeadAt == nil {
		t.Fatalf("discarded row = %+v", row)
	}
	if _, err := outbox.Retry(ctx, pool, f.idle, outbox.StatusDead); conflictOf(t, err).Current.Status != outbox.StatusDiscarded {
		t.Fatal("a discarded event was retried")
	}
}

// Fifty operators retry one dead event at once, each in its own
// transaction: exactly one succeeds, 49 get a conflict showing it pending.
func TestConcurrentRetriesOfOneDeadEvent(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	f := newFixture(t, pool)
	const operators = 50
	var (
		wg              sync.WaitGroup
		mu              sync.Mutex
		wins, conflicts int
		start           = make(chan struct{})
	)
	for range operators {
		wg.Go(func() {
			<-start
			err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
				_, err := outbox.Retry(ctx, tx, f.dead, outbox.StatusDead)
				return err
			})
			var c *outbox.ConflictError
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errors.As(err, &c) && c.Current.Status == outbox.StatusPending:
				conflicts++
			default:
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	if wins != 1 || conflicts != operators-1 {
		t.Fatalf("%d succeeded, %d conflicts; want 1 and %d", wins, conflicts, operators-1)
	}
}

// Inside a caller's transaction the action rolls back with it.
func TestOperatorActionFollowsTheCallersTransaction(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	f := newFixture(t, pool)
	rollback := errors.New("audit insert failed")
	err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		if _, err := outbox.Retry(ctx, tx, f.dead, outbox.StatusDead); err != nil {
			t.Fatalf("Retry in tx: %v", err)
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatal(err)
	}
	if row := mustGet(t, pool, f.dead); row.Status != outbox.StatusDead {
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
	if _, _, err := outbox.RecountBacklog(ctx, pool); err != nil { // statuses set by hand
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
	testkit.Until(t, "relay listening", func() bool {
		var listening bool
		_ = pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND query IN ('LISTEN sluice_outbox', 'LISTEN "sluice_outbox"'))`).Scan(&listening)
		return listening && r.Stats().Claimed == 0
	})
	bulkInsert(t, pool, "wake", 3, 1)
	// Keep poking: a notification sent before LISTEN took effect is lost
	// (that is what polling is for), a later one is not.
	testkit.Until(t, "relay woken by NOTIFY", func() bool {
		n.Poke()
		return len(log.all()) == 3
	})
	cancel()
	<-done
}

// Discarded events are terminal: pruning removes them past retention, by
// discarded_at, and leaves recent ones.
func TestPruneRemovesOldDiscardedEvents(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	bulkInsert(t, pool, "pd", 10, 1)
	now := time.Now()
	_, err := pool.Exec(ctx, `
		WITH numbered AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM outbox_event)
		UPDATE outbox_event e SET status = 'discarded', dead_at = $1::timestamptz - interval '9 days',
		       discarded_at = CASE WHEN n <= 6 THEN $1::timestamptz - interval '8 days' ELSE $1::timestamptz - interval '1 day' END,
		       discard_reason = 'test'
		  FROM numbered WHERE numbered.id = e.id`, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := outbox.RecountBacklog(ctx, pool); err != nil { // statuses changed by hand
		t.Fatal(err)
	}
	n, err := outbox.Prune(ctx, pool, 7*24*time.Hour, 4, now)
	if err != nil || n != 6 {
		t.Fatalf("pruned %d (%v), want the 6 discarded past retention", n, err)
	}
	if c := statusCounts(t, pool); c[outbox.StatusDiscarded] != 4 {
		t.Fatalf("left %v, want 4 recent discarded", c)
	}
}
