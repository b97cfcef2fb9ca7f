package outbox

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
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
	for n := 0; n < 20000; {
		got := claimAll(t, r)
		if len(got) == 0 {
			t.Fatalf("the drain stopped after %d of 20000", n)
		}
		publishClaimed(t, pool, got)
		n += len(got)
	}
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
			n = explainBuffers(t, tx, claimFloorSQL, from)
			_ = tx.Rollback(ctx)
		}
		return n
	}
	fromCursor, fromLowest := buffers(from), buffers(uuid.Nil)
	t.Logf("buffers per walk: %d from the cursor, %d from the lowest id", fromCursor, fromLowest)
	// Quiet, the dead entries are marked in the index and skipped: 5 buffers
	// against 79. While a transaction anywhere keeps them from being dead to
	// everyone, each walk visits their rows: 134 against 1,072 once, in a
	// parallel test run. Either way the walk from the lowest id reads many
	// times more.
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
