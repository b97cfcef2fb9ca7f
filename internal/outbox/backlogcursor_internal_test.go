package outbox

import (
	"context"
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// idAt is a UUIDv7 made at t, as Insert makes them.
func idAt(t time.Time) uuid.UUID {
	u := v7Before(t)
	_, _ = rand.Read(u[6:])
	u[6] = 0x70 | u[6]&0x0f
	u[8] = 0x80 | u[8]&0x3f
	return u
}

// readBoth reads the backlog with the cursor and without, in one snapshot.
func readBoth(t *testing.T, pool *pgxpool.Pool, c *BacklogCursor) (withCursor, fromLowest Backlog) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	a, b := BacklogRead{Cursor: c}, BacklogRead{}
	if _, err := db.ReadAll(ctx, tx, &a); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ReadAll(ctx, tx, &b); err != nil {
		t.Fatal(err)
	}
	return a.Backlog, b.Backlog
}

func sameBacklog(a, b Backlog) error {
	if a.Pending != b.Pending || a.InFlight != b.InFlight || a.OldestPendingAge != b.OldestPendingAge || len(a.Topics) != len(b.Topics) {
		return fmt.Errorf("pending %d / %d, in flight %d / %d, oldest %s / %s, %d / %d topics",
			a.Pending, b.Pending, a.InFlight, b.InFlight, a.OldestPendingAge, b.OldestPendingAge, len(a.Topics), len(b.Topics))
	}
	for i := range a.Topics {
		if a.Topics[i] != b.Topics[i] {
			return fmt.Errorf("topic %d: %+v / %+v", i, a.Topics[i], b.Topics[i])
		}
	}
	return nil
}

// The console's feed reads the backlog with a cursor (BacklogCursor): each
// topic's head is walked from where its pending events started at the
// previous tick, and the few that waited longer are probed by id. Whatever
// happens between two reads — events inserted, some with ids made long
// before their commit, published, leased, dead-lettered, retried below the
// walk's start, held, backing off — the read with the cursor says exactly
// what a walk from the lowest id says, in the same snapshot, while fewer
// than BacklogHead events of a topic wait.
func TestBacklogCursorReadsWhatAWalkFromTheLowestIDReads(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	rng := mrand.New(mrand.NewPCG(12, 34))
	now := time.Now().Add(-time.Hour)
	c := &BacklogCursor{FullWalk: time.Hour, Now: func() time.Time { return now }}
	topics := []string{"orders", "payments", "mail"}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	insert := func(id uuid.UUID, topic string, agg int) {
		t.Helper()
		exec(`INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, created_at)
		      VALUES ($1, 'cur', $2, (SELECT coalesce(max(aggregate_seq), 0) + 1 FROM outbox_event WHERE aggregate_type = 'cur' AND aggregate_id = $2),
		              $3, 'cur.v1', '{}', $4)`, id, fmt.Sprint(agg), topic, time.UnixMilli(v7Millis(id)))
	}
	// pick is one event of status (random among the lowest 50 ids, or any).
	pick := func(status string) (uuid.UUID, bool) {
		var id uuid.UUID
		err := pool.QueryRow(ctx, `SELECT id FROM (SELECT id FROM outbox_event WHERE status = $1 ORDER BY id LIMIT 50) x
		                            ORDER BY random() LIMIT 1`, status).Scan(&id)
		return id, err == nil
	}
	var stuck, rewalked, steps int
	for step := range 400 {
		now = now.Add(time.Duration(50+rng.IntN(400)) * time.Millisecond)
		for range rng.IntN(6) {
			switch op := rng.IntN(100); {
			case op < 35: // a few new events
				for range 1 + rng.IntN(8) {
					insert(idAt(now.Add(-time.Duration(rng.IntN(5))*time.Millisecond)), topics[rng.IntN(len(topics))], rng.IntN(40))
				}
			case op < 40: // committed long after its id was made
				insert(idAt(now.Add(-time.Duration(1+rng.IntN(30))*time.Second)), topics[rng.IntN(len(topics))], 1000+rng.IntN(1000))
			case op < 70: // the relay publishes the oldest
				exec(`UPDATE outbox_event SET status = 'published', published_at = now(), locked_until = NULL
				       WHERE id IN (SELECT id FROM outbox_event WHERE status = 'pending' ORDER BY id LIMIT $1)`, 1+rng.IntN(20))
			case op < 78: // leased
				if id, ok := pick("pending"); ok {
					exec(`UPDATE outbox_event SET locked_until = now() + interval '1 minute', lock_token = gen_random_uuid() WHERE id = $1`, id)
				}
			case op < 84: // a lease ends
				exec(`UPDATE outbox_event SET locked_until = NULL WHERE locked_until IS NOT NULL AND id IN (SELECT id FROM outbox_event WHERE locked_until IS NOT NULL ORDER BY random() LIMIT 1)`)
			case op < 90: // dead-lettered
				if id, ok := pick("pending"); ok {
					exec(`UPDATE outbox_event SET status = 'dead', dead_at = now(), dead_reason = 'test', locked_until = NULL WHERE id = $1`, id)
				}
			case op < 95: // an operator retries a dead letter: pending again, below where the walk starts
				if id, ok := pick("dead"); ok {
					exec(`UPDATE outbox_event SET status = 'pending', dead_at = NULL, dead_reason = NULL, available_at = now() WHERE id = $1`, id)
				}
			default: // backing off
				if id, ok := pick("pending"); ok {
					exec(`UPDATE outbox_event SET available_at = now() + interval '1 hour', attempts = attempts + 1 WHERE id = $1`, id)
				}
			}
		}
		// The statements above change status by hand: the counts follow.
		if _, _, err := RecountBacklog(ctx, pool); err != nil {
			t.Fatal(err)
		}
		got, want := readBoth(t, pool, c)
		if err := sameBacklog(got, want); err != nil {
			t.Fatalf("step %d: with the cursor / from the lowest id: %v", step, err)
		}
		if want.Pending >= BacklogHead {
			t.Fatalf("step %d: %d pending: the test must stay under the head's %d", step, want.Pending, BacklogHead)
		}
		c.mu.Lock()
		for _, tc := range c.topics {
			if len(tc.Stuck) > 0 {
				stuck++
				break
			}
		}
		rewalked = int(c.rewalks)
		c.mu.Unlock()
		steps++
	}
	// The test proves something only if the cursor was used both ways: some
	// reads probed remembered events, and some found an event below the
	// walk's start and walked again.
	t.Logf("%d reads: %d with remembered events, %d topic walks again from the lowest id", steps, stuck, rewalked)
	if stuck < steps/10 || rewalked == 0 || rewalked > steps*len(topics)/2 {
		t.Fatalf("%d reads: %d with remembered events, %d walks again: the mix did not exercise the cursor", steps, stuck, rewalked)
	}
}

// The reason for the cursor: after 20,000 events of a topic published since
// the last vacuum, behind a dead letter and its held event (which stay
// pending for as long as no operator acts), the feed's read walks a small
// part of what a walk from the lowest id walks, and says the same.
func TestBacklogCursorSkipsThePublishedHistory(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	insertHeld(t, pool)
	insertAt(t, pool, 3, 20002)
	if _, err := pool.Exec(ctx, `UPDATE outbox_event SET status = 'published', published_at = now() WHERE status = 'pending' AND id > $1`, v7(2)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := RecountBacklog(ctx, pool); err != nil {
		t.Fatal(err)
	}
	c := &BacklogCursor{FullWalk: time.Hour}
	got, want := readBoth(t, pool, c) // the first read walks from the lowest id
	if err := sameBacklog(got, want); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	tc := c.topics["t"]
	c.mu.Unlock()
	if len(tc.Stuck) != 1 || tc.Stuck[0] != v7(2) {
		t.Fatalf("cursor of t: %+v; want the held event %s remembered", tc, v7(2))
	}
	for range 10 {
		if _, err := pool.Exec(ctx, `INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload)
		                             VALUES ($1, 'new', $2, 1, 't', 'new.v1', '{}')`, uuid.Must(uuid.NewV7()), uuid.NewString()); err != nil {
			t.Fatal(err)
		}
	}
	buffers := func(r *BacklogRead) int {
		t.Helper()
		n := 0
		for range 2 { // the first walk marks the published entries dead in the index
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			sql, args := db.Compose(r)
			n = explainBuffers(t, tx, sql, args...)
			_ = tx.Rollback(ctx)
		}
		return n
	}
	withCursor, fromLowest := buffers(&BacklogRead{Cursor: c}), buffers(&BacklogRead{})
	// The periodic walk from the lowest id is for full heads only: this
	// topic's, with 11 events, is exact without it.
	c.mu.Lock()
	c.fullAt = time.Time{}
	c.mu.Unlock()
	due := buffers(&BacklogRead{Cursor: c})
	t.Logf("buffers per read: %d with the cursor (%d with its periodic walk due), %d from the lowest id", withCursor, due, fromLowest)
	if max(withCursor, due)*4 > fromLowest {
		t.Fatalf("a read with the cursor reads %d buffers (%d with its periodic walk due), from the lowest id %d: the cursor saves less than three quarters", withCursor, due, fromLowest)
	}
	got, want = readBoth(t, pool, c)
	if err := sameBacklog(got, want); err != nil {
		t.Fatal(err)
	}
	if got.Pending != 11 {
		t.Fatalf("%d pending, want the held event and the 10 new ones", got.Pending)
	}
}

// A topic with BacklogHead or more pending events is the one case the count
// check cannot tell: an event made pending below the walk's start (an old
// dead letter retried) is missing from the head until the topic's periodic
// walk from its lowest id, every FullWalk, finds it.
func TestBacklogCursorWalksAFullHeadFromItsLowestIDEveryFullWalk(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	start := time.Now().Add(-time.Hour)
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, dead_at, dead_reason, created_at)
		VALUES ($1, 'old', 'o', 1, 'big', 'big.v1', '{}', 'dead', now(), 'refused', now() - interval '2 hours')`, idAt(start.Add(-time.Hour))); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, created_at)
		SELECT (lpad(to_hex($1::bigint + g), 12, '0') || '7' || substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid,
		       'big', 'b' || g, 1, 'big', 'big.v1', '{}', now() - interval '1 hour'
		  FROM generate_series(1, 1200) g`, start.UnixMilli()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := RecountBacklog(ctx, pool); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	c := &BacklogCursor{FullWalk: 10 * time.Second, Now: func() time.Time { return now }}
	if got, want := readBoth(t, pool, c); sameBacklog(got, want) != nil {
		t.Fatalf("the first read (from the lowest id): %v", sameBacklog(got, want))
	}
	if _, err := pool.Exec(ctx, `UPDATE outbox_event SET status = 'pending', dead_at = NULL, dead_reason = NULL WHERE topic = 'big' AND status = 'dead'`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := RecountBacklog(ctx, pool); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Second)
	got, want := readBoth(t, pool, c)
	if got.Pending != 1201 || want.OldestPendingAge < 119*time.Minute || got.OldestPendingAge > 61*time.Minute {
		t.Fatalf("before the periodic walk: %d pending, oldest %s (from the lowest id %s); want 1201, the retried event not yet in the head", got.Pending, got.OldestPendingAge, want.OldestPendingAge)
	}
	now = now.Add(10 * time.Second)
	got, want = readBoth(t, pool, c)
	if err := sameBacklog(got, want); err != nil {
		t.Fatalf("at the periodic walk: %v", err)
	}
	if got.OldestPendingAge < 119*time.Minute {
		t.Fatalf("oldest %s after the periodic walk, want the retried event's two hours", got.OldestPendingAge)
	}
}
