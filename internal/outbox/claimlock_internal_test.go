package outbox

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// insertPending writes n pending events of n aggregates (one event each, so
// the ordering rule holds none back) and returns their ids in id order.
func insertPending(t *testing.T, pool *pgxpool.Pool, n int) []uuid.UUID {
	t.Helper()
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7())
		if _, err := pool.Exec(context.Background(), `
			INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload)
			VALUES ($1, 'turns', $2, 1, 't', 'turns.v1', '{}')`, ids[i], fmt.Sprint("a", i)); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// unusedPublisher stands in where only the claim runs: nothing is published.
type unusedPublisher struct{ t *testing.T }

func (p unusedPublisher) Publish(context.Context, broker.Message) error {
	p.t.Error("Publish called in a test of the claim alone")
	return errors.New("unused")
}

// holdClaimLock opens a transaction that holds the claim lock, as a relay
// half-way through its claim does; the test commits it, or it is rolled
// back at the end.
func holdClaimLock(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, claimTurnSQL); err != nil {
		t.Fatal(err)
	}
	return tx
}

// turnWaiters counts the sessions of this database waiting for their claim
// turn (the lock on outbox_claim_turn), read through q (a pool, or a
// transaction: that keeps its first look at the activity view unless told
// to take a fresh one).
func turnWaiters(t *testing.T, q db.Querier) int {
	t.Helper()
	ctx := context.Background()
	if _, err := q.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := q.QueryRow(ctx, `
		SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		 WHERE a.datname = current_database() AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		   AND NOT l.granted AND l.relation = 'outbox_claim_turn'::regclass`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Claims take turns (claimTurnSQL). A claim that ran while another was still
// uncommitted would take its snapshot before the other's leases and lock
// the rows the other had just leased, holding up the other relay's mark.
// Here a session plays a relay half-way through its claim: it holds the
// claim lock and has leased the first half of the events, not committed.
// The relay's claim must wait, not run beside it; once the session commits,
// the claim takes exactly the other half, and the leased rows can be marked
// while nothing holds them.
func TestClaimsTakeTurns(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	ids := insertPending(t, pool, 20)
	r, err := NewRelay(pool, unusedPublisher{t}, RelayConfig{Name: "b", BatchSize: 20, DisableListen: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}

	other := holdClaimLock(t, pool)
	otherToken := uuid.New()
	tag, err := other.Exec(ctx, `
		UPDATE outbox_event SET lock_token = $2, locked_until = now() + interval '1 minute', attempts = attempts + 1
		 WHERE id = ANY($1)`, ids[:10], otherToken)
	if err != nil || tag.RowsAffected() != 10 {
		t.Fatalf("lease the first half: %v rows, %v", tag.RowsAffected(), err)
	}

	type result struct {
		got []claimed
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, _, err := r.claim(ctx, uuid.New())
		done <- result{got, err}
	}()
	testkit.Until(t, "the relay's claim waits for the claim lock", func() bool { return turnWaiters(t, pool) == 1 })
	select {
	case res := <-done:
		t.Fatalf("the claim ran beside an uncommitted claim: %d events, %v", len(res.got), res.err)
	default:
	}
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	if len(res.got) != 10 {
		t.Fatalf("claimed %d events, want the 10 the other claim did not lease", len(res.got))
	}
	for i, c := range res.got {
		if c.ID != ids[10+i] {
			t.Fatalf("claimed event %d is %s, want %s (the second half, in id order)", i, c.ID, ids[10+i])
		}
	}
	// The other relay marks its half; NOWAIT fails at once if any row is
	// still locked by someone.
	tag, err = pool.Exec(ctx, `
		WITH l AS (SELECT id FROM outbox_event WHERE id = ANY($1) FOR UPDATE NOWAIT)
		UPDATE outbox_event e SET status = 'published', published_at = now(), locked_until = NULL
		  FROM l WHERE e.id = l.id AND e.lock_token = $2`, ids[:10], otherToken)
	if err != nil || tag.RowsAffected() != 10 {
		t.Fatalf("mark the other half: %d rows, %v", tag.RowsAffected(), err)
	}
}

// A claim given up while it waits for its turn (shutdown) leaves nothing
// behind: no lease, no lock, no connection inside a transaction. The next
// claim runs at once.
func TestClaimGivenUpWhileWaitingLeavesNothing(t *testing.T) {
	t.Parallel()
	cfg := dbtest.Config(t)
	cfg.MaxConns = 2 // the blocker's and the relay's: a leaked transaction would be reused
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // after the blocker's rollback (cleanups run last first)
	ctx := context.Background()
	insertPending(t, pool, 5)
	r, err := NewRelay(pool, unusedPublisher{t}, RelayConfig{Name: "r", BatchSize: 10, DisableListen: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	blocker := holdClaimLock(t, pool)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, _, err := r.claim(cctx, uuid.New())
		done <- err
	}()
	testkit.Until(t, "the claim waits for its turn", func() bool { return turnWaiters(t, blocker) == 1 })
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("claim given up = %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the claim did not return after its context was cancelled")
	}
	if err := blocker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got, _, err := r.claim(ctx, uuid.New())
	if err != nil || len(got) != 5 {
		t.Fatalf("the next claim took %d events (%v), want all 5", len(got), err)
	}
	var held, chargedOtherThanOnce int
	if err := pool.QueryRow(ctx, `
		SELECT count(*) FROM pg_locks
		 WHERE database = (SELECT oid FROM pg_database WHERE datname = current_database())
		   AND relation = 'outbox_claim_turn'::regclass`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE attempts <> 1`).Scan(&chargedOtherThanOnce); err != nil {
		t.Fatal(err)
	}
	if held != 0 || chargedOtherThanOnce != 0 {
		t.Fatalf("after the claims: %d claim turn locks held, %d events charged other than once; want 0 and 0", held, chargedOtherThanOnce)
	}
}

// A relay waiting for its turn holds no snapshot. The relay sends its next
// claim while the previous one's COMMIT is still on its way, so a snapshot
// taken for the wait (as the SELECT of the advisory lock this replaced took)
// is older than the relay's own last claim: the row versions that claim
// replaced (its leases are HOT updates) could not be pruned while it waited,
// and the marks that followed found no room on the rows' pages and wrote
// every new version in full on another page (bench/README.md, change 12).
// LOCK TABLE takes no snapshot, and once the connection has looked the
// table up, its name comes from the catalog cache without one. Here a
// session holds the turn and a relay whose connection has taken it before
// waits: its backend must show no xmin, and the row versions an update
// replaces meanwhile must be removable: VACUUM leaves none.
func TestClaimWaitsForItsTurnWithoutASnapshot(t *testing.T) {
	t.Parallel()
	cfg := dbtest.Config(t)
	cfg.MaxConns = 2 // the blocker's and the relay's
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	watch, err := pgxpool.NewWithConfig(context.Background(), cfg.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(watch.Close)
	ctx := context.Background()
	ids := insertPending(t, watch, 10)
	r, err := NewRelay(pool, unusedPublisher{t}, RelayConfig{Name: "w", BatchSize: 10, DisableListen: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Both connections take the turn once, as a running relay's connections
	// have: the table's name is then in their catalog caches.
	var conns []*pgxpool.Conn
	for range 2 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, claimTurnSQL); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns {
		c.Release()
	}

	blocker := holdClaimLock(t, pool)
	done := make(chan error, 1)
	go func() {
		_, _, err := r.claim(ctx, uuid.New())
		done <- err
	}()
	lockWaiters := func() (waiting, withXmin int) {
		if err := watch.QueryRow(ctx, `
			SELECT count(*), count(backend_xmin) FROM pg_stat_activity
			 WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting, &withXmin); err != nil {
			t.Fatal(err)
		}
		return waiting, withXmin
	}
	testkit.Until(t, "the relay's claim waits for its turn", func() bool { w, _ := lockWaiters(); return w == 1 })
	if waiting, withXmin := lockWaiters(); waiting != 1 || withXmin != 0 {
		t.Fatalf("%d relays wait for their turn, %d of them with a snapshot's xmin; want 1 and 0", waiting, withXmin)
	}
	// Row versions replaced after the wait began: a waiter's xmin would keep them.
	if _, err := watch.Exec(ctx, `UPDATE outbox_event SET attempts = attempts WHERE id = ANY($1)`, ids); err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Exec(ctx, `VACUUM outbox_event`); err != nil {
		t.Fatal(err)
	}
	var dead int64
	if err := watch.QueryRow(ctx, `SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'outbox_event'`).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if err := blocker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if dead != 0 {
		t.Fatalf("VACUUM left %d replaced row versions while a relay waited for its turn; want 0", dead)
	}
}

// The services connect as the application role (`console db grant`), which
// owns nothing: taking the claim turn must not need more than the grant
// gives it (LOCK TABLE in EXCLUSIVE mode needs UPDATE, DELETE or TRUNCATE
// on outbox_claim_turn).
func TestClaimTurnAsTheApplicationRole(t *testing.T) {
	t.Parallel()
	owner := dbtest.New(t)
	app := dbtest.AppRole(t, owner)
	insertPending(t, owner, 3)
	r, err := NewRelay(app, unusedPublisher{t}, RelayConfig{Name: "app", BatchSize: 10, DisableListen: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := r.claim(context.Background(), uuid.New())
	if err != nil || len(got) != 3 {
		t.Fatalf("the application role's claim took %d events (%v), want 3", len(got), err)
	}
}

// claim is claimStart waiting for the claim's COMMIT: the events once their
// lease is durable, as these tests read the table right after.
func (r *Relay) claim(ctx context.Context, token uuid.UUID) ([]claimed, int, error) {
	out, expired, leased, err := r.claimStart(ctx, token)
	if err == nil && leased != nil {
		if err = <-leased; err != nil {
			return nil, 0, err
		}
	}
	return out, expired, err
}
