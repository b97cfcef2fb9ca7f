package outbox

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// publishClaimed marks claimed events published, as the relay's mark does.
func publishClaimed(t *testing.T, pool *pgxpool.Pool, evs []claimed) {
	t.Helper()
	ids := make([]uuid.UUID, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
	}
	if _, err := pool.Exec(context.Background(), `
		UPDATE outbox_event SET status = 'published', published_at = now(), locked_until = NULL WHERE id = ANY($1)`, ids); err != nil {
		t.Fatal(err)
	}
}

// v7 is an id in the order outbox.Insert makes them, n-th of a test.
func v7(n int) uuid.UUID {
	return uuid.MustParse(fmt.Sprintf("00000000-0000-7000-8000-%012x", n))
}

// drainPublishing claims and publishes until n events were published.
func drainPublishing(t *testing.T, pool *pgxpool.Pool, r *Relay, n int) {
	t.Helper()
	for done := 0; done < n; {
		got := claimAll(t, r)
		if len(got) == 0 {
			t.Fatalf("the drain stopped after %d of %d", done, n)
		}
		publishClaimed(t, pool, got)
		done += len(got)
	}
}

// insertHeld turns autovacuum off on outbox_event (the dead index entries
// the tests measure stay) and writes a dead letter, v7(1), and an event of
// its aggregate held behind it, v7(2), both of topic t.
func insertHeld(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `ALTER TABLE outbox_event SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, dead_at, dead_reason)
		VALUES ($1, 'stuck', 'held', 1, 't', 'stuck.v1', '{}', 'dead', now(), 'refused'),
		       ($2, 'stuck', 'held', 2, 't', 'stuck.v1', '{}', 'pending', NULL, NULL)`, v7(1), v7(2)); err != nil {
		t.Fatal(err)
	}
}

func insertAt(t *testing.T, pool *pgxpool.Pool, from, to int) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload)
		SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, 'cursor', 'a' || g, 1, 't', 'cursor.v1', '{}'
		  FROM generate_series($1::int, $2::int) g`, from, to); err != nil {
		t.Fatal(err)
	}
}

// cursorRelay is a relay that claims only (nothing is published) and walks
// from the lowest id only when the cursor is unset or a claim took nothing
// from it (its full walk is an hour away).
func cursorRelay(t *testing.T, pool *pgxpool.Pool) *Relay {
	t.Helper()
	r, err := NewRelay(pool, unusedPublisher{t}, RelayConfig{Name: "r", BatchSize: 500, DisableListen: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.cursor.fullWalk = time.Hour
	return r
}

func claimAll(t *testing.T, r *Relay) []claimed {
	t.Helper()
	got, _, err := r.claim(context.Background(), uuid.New())
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func idsOfClaimed(evs []claimed) []uuid.UUID {
	out := make([]uuid.UUID, len(evs))
	for i, ev := range evs {
		out[i] = ev.ID
	}
	slices.SortFunc(out, func(a, b uuid.UUID) int { return strings.Compare(a.String(), b.String()) })
	return out
}

// A published event's entry stays in outbox_event_pending_idx until VACUUM,
// so a claim that walked the index from the lowest id read more with every
// event published since (claimCursor). The relay's claim starts at its
// cursor: after a drain of 20,000 events it reads a small part of what a
// walk from the lowest id reads.
func TestClaimWalksFromTheCursorNotThePublishedHistory(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `ALTER TABLE outbox_event SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	insertAt(t, pool, 1, 20000)
	r := cursorRelay(t, pool)
	drainPublishing(t, pool, r, 20000)
	insertAt(t, pool, 20001, 20010)
	from, full := r.cursor.start(time.Now())
	if full || from != v7(19501) {
		t.Fatalf("cursor after the drain at %s (full walk %v), want the last batch's first id %s", from, full, v7(19501))
	}
	// What the claim's walk reads from there, and from the lowest id: the
	// floor's read, which finds the lowest pending id (the claim itself then
	// starts there either way), run twice: the first walk marks the
	// published entries dead in the index, the second is what every later
	// walk pays.
	buffers := func(from uuid.UUID) int {
		t.Helper()
		n := 0
		for range 2 {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			n = explainBuffers(t, tx, claimFloorSQL, from, nil, true)
			_ = tx.Rollback(ctx)
		}
		return n
	}
	// Quiet, the dead entries are marked in the index and skipped: 5 buffers
	// against 79. While a transaction keeps them from being dead to
	// everyone, each walk visits their rows: 134 against 1,072 once, in a
	// parallel test run. But when only the last batch's entries cannot be
	// marked yet (it was published a moment ago), both walks visit its 500
	// rows and the ratio shrinks (136 against 210 once): the measurement is
	// repeated, a moment apart, until those can be marked too.
	var fromCursor, fromLowest int
	for try := range 20 {
		fromCursor, fromLowest = buffers(from), buffers(uuid.Nil)
		t.Logf("buffers per walk: %d from the cursor, %d from the lowest id", fromCursor, fromLowest)
		if fromCursor*4 <= fromLowest || try == 19 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if fromCursor*4 > fromLowest {
		t.Fatalf("a walk from the cursor reads %d buffers, from the lowest id %d: the cursor saves less than three quarters", fromCursor, fromLowest)
	}
	if got := claimAll(t, r); len(got) != 10 || got[0].ID != v7(20001) {
		t.Fatalf("claimed %d events after the drain, want the 10 new ones", len(got))
	}
}

var buffersRE = regexp.MustCompile(`Buffers: shared hit=(\d+)(?: read=(\d+))?`)

// explainBuffers is the buffers the top node of sql's plan read.
func explainBuffers(t *testing.T, tx pgx.Tx, sql string, args ...any) int {
	t.Helper()
	rows, err := tx.Query(context.Background(), "EXPLAIN (ANALYZE, BUFFERS) "+sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		if m := buffersRE.FindStringSubmatch(l); m != nil {
			hit, _ := strconv.Atoi(m[1])
			read, _ := strconv.Atoi(m[2])
			return hit + read
		}
	}
	t.Fatalf("no buffers in the plan:\n%s", strings.Join(lines, "\n"))
	return 0
}

// What the cursor cannot see — an event pending below it, as an operator's
// retry or a late commit leaves one — is claimed when a claim from the
// cursor takes nothing, and by the full walk a busy relay makes once per
// fullWalk.
func TestClaimFindsEventsBelowTheCursor(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	r := cursorRelay(t, pool)
	insertAt(t, pool, 100, 109)
	publishClaimed(t, pool, claimAll(t, r))
	publishClaimed(t, pool, claimAll(t, r)) // nothing left: the cursor is set
	insertAt(t, pool, 110, 112)
	insertAt(t, pool, 2, 2) // below the cursor
	if got := idsOfClaimed(claimAll(t, r)); !slices.Equal(got, []uuid.UUID{v7(110), v7(111), v7(112)}) {
		t.Fatalf("claimed %v from the cursor, want 110–112 (2 lies below it)", got)
	}
	// A busy relay: more above the cursor, and a full walk due.
	insertAt(t, pool, 113, 114)
	r.cursor.mu.Lock()
	r.cursor.walkedAt = time.Now().Add(-2 * time.Hour)
	r.cursor.mu.Unlock()
	if got := idsOfClaimed(claimAll(t, r)); !slices.Equal(got, []uuid.UUID{v7(2), v7(113), v7(114)}) {
		t.Fatalf("claimed %v on the full walk, want 2, 113 and 114", got)
	}
	// Nothing from the cursor: the claim looks again from the lowest id.
	if _, err := pool.Exec(context.Background(), `UPDATE outbox_event SET status = 'published', published_at = now(), locked_until = NULL`); err != nil {
		t.Fatal(err)
	}
	insertAt(t, pool, 1, 1)
	if got := idsOfClaimed(claimAll(t, r)); !slices.Equal(got, []uuid.UUID{v7(1)}) {
		t.Fatalf("claimed %v with nothing from the cursor, want 1", got)
	}
}

// An event committed a moment after its id was made, with a claim in
// between that moved the cursor past that id, is claimed by the next claim
// of a busy relay, not a second later by the full walk (lateCommit).
func TestClaimFindsAnEventCommittedJustAfterTheCursorPassedItsID(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	r := cursorRelay(t, pool)
	insert := func(id uuid.UUID) {
		t.Helper()
		if _, err := pool.Exec(context.Background(), `
			INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload)
			VALUES ($1, 'late', $2, 1, 't', 'late.v1', '{}')`, id, id.String()); err != nil {
			t.Fatal(err)
		}
	}
	first := uuid.Must(uuid.NewV7())
	insert(first)
	publishClaimed(t, pool, claimAll(t, r))
	late := uuid.Must(uuid.NewV7()) // made now, committed after the next claim
	next := uuid.Must(uuid.NewV7())
	insert(next)
	if got := idsOfClaimed(claimAll(t, r)); !slices.Equal(got, []uuid.UUID{next}) { // leased, still pending
		t.Fatalf("claimed %v, want %s", got, next)
	}
	r.cursor.mu.Lock()
	from := r.cursor.from
	r.cursor.mu.Unlock()
	if from != next {
		t.Fatalf("cursor at %s, want %s: the test must move it past the late id", from, next)
	}
	insert(late)
	last := uuid.Must(uuid.NewV7())
	insert(last)
	if got := idsOfClaimed(claimAll(t, r)); !slices.Equal(got, []uuid.UUID{late, last}) {
		t.Fatalf("claimed %v, want the late event %s and %s", got, late, last)
	}
}

// An event that stays pending without being claimable — held behind a dead
// letter of its aggregate, or backing off — must not hold the cursor at its
// id: every claim would walk again the entries of everything published
// since, as before the cursor. The cursor passes over such events; once
// they can be published again (the dead letter retried, the backoff over),
// the full walk claims them, and a claim that takes nothing from the cursor.
func TestClaimCursorPassesEventsThatCannotBeClaimed(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	insertHeld(t, pool) // v7(1) dead, v7(2) held behind it
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, available_at)
		VALUES ($1, 'stuck', 'later', 1, 't', 'stuck.v1', '{}', now() + interval '1 hour')`, v7(3)); err != nil {
		t.Fatal(err)
	}
	insertAt(t, pool, 4, 20003)
	r := cursorRelay(t, pool)
	drainPublishing(t, pool, r, 20000)
	from, full := r.cursor.start(time.Now())
	if full || from != v7(19504) {
		t.Fatalf("cursor after the drain at %s (full walk %v), want the last batch's first id %s, past the held and the backing-off events", from, full, v7(19504))
	}
	insertAt(t, pool, 20004, 20013)
	if got := claimAll(t, r); len(got) != 10 || got[0].ID != v7(20004) {
		t.Fatalf("claimed %d events after the drain, want the 10 new ones", len(got))
	}
	// The dead letter retried and the backoff over: the full walk claims
	// both (the held event waits for the retried one, its predecessor), and
	// the held event is claimed once its predecessor is published, by a
	// claim that found nothing from the cursor.
	if _, err := pool.Exec(ctx, `UPDATE outbox_event SET status = 'pending', dead_at = NULL, dead_reason = NULL WHERE id = $1`, v7(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE outbox_event SET available_at = now() - interval '1 second' WHERE id = $1`, v7(3)); err != nil {
		t.Fatal(err)
	}
	r.cursor.mu.Lock()
	r.cursor.walkedAt = time.Now().Add(-2 * time.Hour)
	r.cursor.mu.Unlock()
	got := claimAll(t, r)
	if ids := idsOfClaimed(got); !slices.Equal(ids, []uuid.UUID{v7(1), v7(3)}) {
		t.Fatalf("the full walk claimed %v, want the retried event %s and the one whose backoff is over %s", ids, v7(1), v7(3))
	}
	publishClaimed(t, pool, got)
	if ids := idsOfClaimed(claimAll(t, r)); !slices.Equal(ids, []uuid.UUID{v7(2)}) {
		t.Fatalf("claimed %v after its predecessor was published, want the held event %s", ids, v7(2))
	}
}

// A walk from the lowest id passes over the whole history since the last
// vacuum; while a snapshot is held open it visits the table for each entry
// and can take longer than the once a second it was due. Walks are spaced
// by walkSpacing times their own length, the periodic one and the one after
// an empty claim alike; a fast walk changes nothing.
func TestWalksFromTheLowestIDAreSpacedByTheirLength(t *testing.T) {
	t.Parallel()
	c := claimCursor{fullWalk: time.Second}
	id := v7(5)
	t0 := time.Unix(1000, 0)
	end := t0.Add(200 * time.Millisecond)
	c.moved(&id, true, 200*time.Millisecond, end) // a walk of 200 ms: the next one 1.8 s after it
	for _, tc := range []struct {
		after      time.Duration
		full, walk bool
	}{{time.Second, false, false}, {1700 * time.Millisecond, false, false}, {1800 * time.Millisecond, true, true}} {
		if _, full := c.start(end.Add(tc.after)); full != tc.full {
			t.Errorf("%s after a 200 ms walk: a periodic walk %v, want %v", tc.after, full, tc.full)
		}
		if walk := c.rewalk(end.Add(tc.after)); walk != tc.walk {
			t.Errorf("%s after a 200 ms walk: a walk after an empty claim %v, want %v", tc.after, walk, tc.walk)
		}
	}
	t1 := end.Add(time.Hour)
	c.moved(&id, true, time.Millisecond, t1.Add(time.Millisecond)) // a walk of 1 ms
	if !c.rewalk(t1.Add(time.Millisecond)) {
		t.Error("right after a 1 ms walk, a claim that took nothing may not walk again")
	}
	if _, full := c.start(t1.Add(500 * time.Millisecond)); full {
		t.Error("the periodic walk came after 0.5 s, want 1 s (fullWalk)")
	}
	if _, full := c.start(t1.Add(1001 * time.Millisecond)); !full {
		t.Error("no periodic walk after 1 s")
	}
}

// A new event's available_at is its transaction's start, which can be a
// moment later than the claim's clock (its statement timestamp, set before
// the claim lock was granted). Such an event is not backing off: the cursor
// must not pass over it, or it waits below the cursor for a walk from the
// lowest id (bench R2 at 2,500/s: 12,300 events stuck for 15 s).
func TestClaimCursorDoesNotPassAnEventAvailableInAMoment(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	var skew atomic.Int64 // the claim's clock behind the database's
	skew.Store(int64(500 * time.Millisecond))
	r, err := NewRelay(pool, unusedPublisher{t}, RelayConfig{Name: "r", BatchSize: 500, DisableListen: true,
		Now: func() time.Time { return time.Now().Add(-time.Duration(skew.Load())) }}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.cursor.fullWalk = time.Hour
	// 1: new, available at its transaction's start; 2: claimable long since.
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, available_at)
		VALUES ($1, 'soon', 'a', 1, 't', 'soon.v1', '{}', now()),
		       ($2, 'soon', 'b', 1, 't', 'soon.v1', '{}', now() - interval '1 hour')`, v7(1), v7(2)); err != nil {
		t.Fatal(err)
	}
	got := claimAll(t, r)
	if ids := idsOfClaimed(got); !slices.Equal(ids, []uuid.UUID{v7(2)}) {
		t.Fatalf("claimed %v with the claim's clock 0.5 s behind, want only %s", ids, v7(2))
	}
	publishClaimed(t, pool, got)
	skew.Store(0)
	insertAt(t, pool, 3, 3) // so the next claim takes something from the cursor and does not look again
	if ids := idsOfClaimed(claimAll(t, r)); !slices.Equal(ids, []uuid.UUID{v7(1), v7(3)}) {
		t.Fatalf("claimed %v once the clock caught up, want %s (available a moment after the first claim's clock) and %s", ids, v7(1), v7(3))
	}
}

// emptiedAfterABacklog leaves outbox_event as a reset deployment's is:
// analyzed with a backlog, then emptied by a TRUNCATE, so its statistics say
// it is empty and keep its columns' (ANALYZE of an empty table leaves them).
// Autovacuum stays off, as it may be on a large table between its visits.
func emptiedAfterABacklog(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `ALTER TABLE outbox_event SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	insertAt(t, pool, 1, 3000)
	for _, sql := range []string{`ANALYZE outbox_event`, `TRUNCATE outbox_event`, `VACUUM ANALYZE outbox_event`} {
		if _, err := pool.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
}

// relayPlannedOnEmpty opens a pool of cfg (one connection: the relay's
// statements and the test's checks on one session) and a relay on it that
// has claimed from the empty table 8 times: past the five custom plans after
// which PostgreSQL may choose a prepared statement's plan itself.
func relayPlannedOnEmpty(t *testing.T, cfg *pgxpool.Config) (*pgxpool.Pool, *Relay) {
	t.Helper()
	cfg.MaxConns = 1
	one, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(one.Close)
	r := cursorRelay(t, one)
	for range 8 {
		if got := claimAll(t, r); len(got) != 0 {
			t.Fatalf("claimed %d from an empty table", len(got))
		}
	}
	return one, r
}

// The claim's floor read and the claim run on their prepared statements'
// generic plans, made once per connection (claimPlanSQL). A generic plan made
// while the table looked empty (a TRUNCATE and VACUUM, a new deployment) once
// scanned the table and probed each pending row's aggregate by scanning it
// again: 936 ms at 3,000 pending rows, and bench R2 stalled for 15 s behind
// it; the claim's update, joined to the claimed rows, walked the whole
// primary key. Made under the relay's settings, the plans walk the pending
// rows' indexes whatever the statistics said: after the table filled up,
// with a topic paused and its backlog first in id order and no ANALYZE
// since, the floor read reads a few dozen buffers and the claim about the
// rows it takes, not the table once per row, and neither starts a JIT
// compilation.
func TestClaimGenericPlansMadeOnAnEmptyTable(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	emptiedAfterABacklog(t, pool)
	one, r := relayPlannedOnEmpty(t, pool.Config())
	const (
		floorStatement = `FROM pg_prepared_statements WHERE statement LIKE '%WITH RECURSIVE p AS%' AND statement NOT LIKE '%pg_prepared_statements%'`
		claimStatement = `FROM pg_prepared_statements WHERE statement LIKE '%UPDATE outbox_event e%' AND statement NOT LIKE '%pg_prepared_statements%'`
	)
	var (
		name, claimName string
		generic, custom int64
	)
	// The floor read has run on the empty table; the claim, which runs only
	// when the floor read found something, is prepared below, once the table
	// has filled up, on the statistics of the empty one.
	if err := one.QueryRow(ctx, `SELECT name, generic_plans, custom_plans `+floorStatement).Scan(&name, &generic, &custom); err != nil {
		t.Fatalf("the floor read's prepared statement on the relay's connection: %v", err)
	}
	if generic < 8 || custom != 0 {
		t.Fatalf("the floor read ran %d generic and %d custom plans on the relay's connection, want only generic ones", generic, custom)
	}
	// 2,000 pending events of a paused topic first, then 1,000 of a running one.
	// Written with their topics: an UPDATE of the topic would leave the old
	// versions' entries in the topic index, which a walk visits while
	// another test's snapshot keeps them from being marked dead.
	if _, err := one.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload)
		SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, 'cursor', 'a' || g, 1,
		       CASE WHEN g <= 2000 THEN 'paused' ELSE 'running' END, 'cursor.v1', '{}'
		  FROM generate_series(1, 3000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := one.Exec(ctx, `INSERT INTO outbox_topic_pause (topic, paused_by, reason) VALUES ('paused', 'test', 'plan')`); err != nil {
		t.Fatal(err)
	}
	if got := claimAll(t, r); len(got) != 500 || got[0].ID != v7(2001) {
		t.Fatalf("claimed %d after the table filled up, want the running topic's first 500", len(got))
	}
	if err := one.QueryRow(ctx, `SELECT name, generic_plans, custom_plans `+claimStatement).Scan(&claimName, &generic, &custom); err != nil {
		t.Fatalf("the claim's prepared statement on the relay's connection: %v", err)
	}
	if generic != 1 || custom != 0 {
		t.Fatalf("the claim ran %d generic and %d custom plans on the relay's connection, want one generic one", generic, custom)
	}
	tx, err := one.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	relaySettings(t, tx)
	plan := planText(t, tx, "EXPLAIN (ANALYZE, BUFFERS) EXECUTE "+pgx.Identifier{name}.Sanitize()+"('00000000-0000-0000-0000-000000000000', NULL, true)")
	t.Logf("the floor read's generic plan, made on the empty table, run on 3,000 rows:\n%s", plan)
	if err := tx.QueryRow(ctx, `SELECT generic_plans, custom_plans `+floorStatement).Scan(&generic, &custom); err != nil {
		t.Fatal(err)
	}
	if custom != 0 {
		t.Fatalf("the floor read ran %d custom plans", custom)
	}
	for _, want := range []string{"outbox_event_pending_topic_idx", "outbox_event_pending_idx", "outbox_event_pending_aggregate_idx"} {
		if !strings.Contains(plan, want) {
			t.Fatalf("the floor read's generic plan does not use %s:\n%s", want, plan)
		}
	}
	if strings.Contains(plan, "Seq Scan on outbox_event") || regexp.MustCompile(`Sort Key: e[_0-9]*\.`).MatchString(plan) || strings.Contains(plan, "JIT:") {
		t.Fatalf("the floor read's generic plan scans or sorts the table's rows, or compiles itself:\n%s", plan)
	}
	if n := planBuffers(t, plan); n > 100 {
		t.Fatalf("the floor read's walk read %d buffers on 3,000 rows, want a few dozen:\n%s", n, plan)
	}

	// The claim's cached plan, run from the floor (the running topic's
	// first id), the paused topic passed over: 500 rows taken by walking an
	// index in id order from the floor, each probed once by aggregate and
	// updated through a primary key probe. Statistics that say nearly every
	// row is pending (these: the last ANALYZE saw only pending rows) make the
	// primary key and the pending index cost the same, and the walk may
	// take either (claimSQL says why both are bounded).
	claim := planText(t, tx, "EXPLAIN (ANALYZE, BUFFERS) EXECUTE "+pgx.Identifier{claimName}.Sanitize()+
		"(NULL, 500, 30000000, '00000000-0000-0000-0000-000000000001', '"+v7(2001).String()+"', '{paused}')")
	t.Logf("the claim's generic plan, made on the empty table, run on 3,000 rows:\n%s", claim)
	if err := tx.QueryRow(ctx, `SELECT custom_plans `+claimStatement).Scan(&custom); err != nil {
		t.Fatal(err)
	}
	if custom != 0 {
		t.Fatalf("the claim ran %d custom plans", custom)
	}
	if !claimWalkRE.MatchString(claim) {
		t.Fatalf("the claim's generic plan does not walk an index of ids from the floor:\n%s", claim)
	}
	for _, want := range []string{"outbox_event_pending_aggregate_idx", "Index Scan using outbox_event_pkey on outbox_event e", "Index Cond: (id = ANY (", "rows=500 loops=1"} {
		if !strings.Contains(claim, want) {
			t.Fatalf("the claim's generic plan does not show %q:\n%s", want, claim)
		}
	}
	if strings.Contains(claim, "Seq Scan") || strings.Contains(claim, "Sort") || strings.Contains(claim, "Join") || strings.Contains(claim, "JIT:") {
		t.Fatalf("the claim's generic plan scans, sorts or joins the table's rows, or compiles itself:\n%s", claim)
	}
	if n := planBuffers(t, claim); n > 5000 {
		t.Fatalf("the claim read %d buffers to take 500 of 3,000 rows, want about ten per row taken:\n%s", n, claim)
	}
}

// planBuffers is the buffers an EXPLAIN (ANALYZE, BUFFERS) plan's top node
// read, hit or not.
func planBuffers(t *testing.T, plan string) int {
	t.Helper()
	m := buffersRE.FindStringSubmatch(plan)
	if m == nil {
		t.Fatalf("no buffers in the plan:\n%s", plan)
	}
	hit, _ := strconv.Atoi(m[1])
	read, _ := strconv.Atoi(m[2]) // absent: none read
	return hit + read
}

// claimWalkRE is the claim's walk in a generic plan: an index of ids in
// their order from the floor ($5), the pending rows' own or, on statistics
// that make the two cost the same, the primary key (claimSQL).
var claimWalkRE = regexp.MustCompile(`Index Scan using outbox_event_(pending_idx|pkey) on outbox_event c[^\n]*\n(\s+Buffers[^\n]*\n)?\s+Index Cond: \(id >= \$5\)`)

// What the relay's connection plans, seen by auto_explain as it runs: on a
// table emptied after an ANALYZE and filled since, the floor read and the
// claim run on their generic plans (their parameters stay $n), each walking
// the pending index from the cursor, and the claim updates its rows by
// primary key probes, never by a join.
func TestClaimPlansAsTheRelayRunsThem(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	emptiedAfterABacklog(t, pool)
	var (
		mu    sync.Mutex
		plans []string
	)
	cfg := pool.Config()
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if strings.Contains(n.Message, "plan:") {
			mu.Lock()
			plans = append(plans, n.Message)
			mu.Unlock()
		}
	}
	after := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if after != nil {
			if err := after(ctx, c); err != nil {
				return err
			}
		}
		// auto_explain sends each statement's plan to the client as a notice.
		_, err := c.Exec(ctx, `LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0; SET auto_explain.log_level = notice`)
		return err
	}
	one, r := relayPlannedOnEmpty(t, cfg)
	insertAt(t, one, 1, 3000)
	mu.Lock()
	plans = nil
	mu.Unlock()
	if got := claimAll(t, r); len(got) != 500 {
		t.Fatalf("claimed %d after the table filled up, want 500", len(got))
	}
	mu.Lock()
	defer mu.Unlock()
	var floor, claim string
	for _, p := range plans {
		switch {
		case strings.Contains(p, "WITH RECURSIVE p AS"):
			floor = p
		case strings.Contains(p, "UPDATE outbox_event e"):
			claim = p
		}
	}
	if floor == "" || claim == "" {
		t.Fatalf("auto_explain showed %d plans, not the floor read's and the claim's:\n%s", len(plans), strings.Join(plans, "\n\n"))
	}
	t.Logf("the floor read:\n%s\n\nthe claim:\n%s", floor, claim)
	planOnly := func(p string) string { // the plan, without the statement's text before it
		if i := strings.Index(p, "(cost="); i >= 0 {
			return p[strings.LastIndex(p[:i], "\n")+1:]
		}
		return p
	}
	if f := planOnly(floor); !strings.Contains(f, "Index Cond: (id >= $1)") || !strings.Contains(f, "outbox_event_pending_idx") {
		t.Fatalf("the floor read did not run on its generic plan walking outbox_event_pending_idx:\n%s", f)
	}
	if c := planOnly(claim); !claimWalkRE.MatchString(c) || !strings.Contains(c, "Index Scan using outbox_event_pkey on outbox_event e") || strings.Contains(c, "Join") {
		t.Fatalf("the claim did not run on its generic plan walking the ids from the floor and updating by primary key probes:\n%s", c)
	}
}
