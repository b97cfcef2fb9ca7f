package outbox_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// listAll pages through a filter and returns every id, checking that pages
// are full until the last.
func listAll(t *testing.T, ctx context.Context, q db.Querier, f outbox.Filter, oldest bool, limit int) []uuid.UUID {
	t.Helper()
	var (
		ids   []uuid.UUID
		after string
	)
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatal("paging does not end")
		}
		page, err := outbox.List(ctx, q, f, outbox.Page{Limit: limit, After: after, Oldest: oldest})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Rows {
			ids = append(ids, r.ID)
		}
		if page.Next == "" {
			return ids
		}
		if len(page.Rows) != limit {
			t.Fatalf("a page of %d rows, not the last, has a next cursor", len(page.Rows))
		}
		after = page.Next
	}
}

func TestListFiltersAndPages(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	events := bulkInsert(t, pool, "l", 30, 5)
	// l-0…l-9 are on the payments topic; l-3's first event is dead with
	// an error; l-4's second event is pending under a live lease.
	_, err := pool.Exec(ctx, `
		UPDATE outbox_event SET topic = 'payments' WHERE aggregate_id IN ('l-0','l-1','l-2','l-3','l-4','l-5','l-6','l-7','l-8','l-9');
		UPDATE outbox_event SET status = 'dead', dead_at = now(), last_error = 'Broker said: 100% NO_ROUTE'
		 WHERE aggregate_id = 'l-3' AND aggregate_seq = 1;
		UPDATE outbox_event SET locked_until = now() + interval '1 hour', lock_token = gen_random_uuid()
		 WHERE aggregate_id = 'l-4' AND aggregate_seq = 2`)
	if err != nil {
		t.Fatal(err)
	}
	// Topics and a status changed by hand: recount, as whoever does it must.
	if _, _, err := outbox.RecountBacklog(ctx, pool); err != nil {
		t.Fatal(err)
	}
	all := make([]uuid.UUID, len(events))
	for i, e := range events {
		all[i] = e.ID
	}
	slices.SortFunc(all, func(a, b uuid.UUID) int { return strings.Compare(a.String(), b.String()) })

	if got := listAll(t, ctx, pool, outbox.Filter{}, true, 7); !slices.Equal(got, all) {
		t.Fatalf("oldest first: %d ids, not the %d in id order", len(got), len(all))
	}
	desc := slices.Clone(all)
	slices.Reverse(desc)
	if got := listAll(t, ctx, pool, outbox.Filter{}, false, 7); !slices.Equal(got, desc) {
		t.Fatalf("newest first: %d ids, not the %d in reverse id order", len(got), len(desc))
	}
	for _, c := range []struct {
		name string
		f    outbox.Filter
		want int
	}{
		{"topic", outbox.Filter{Topic: "payments"}, 50},
		{"topic and type", outbox.Filter{Topic: "payments", EventType: "test.happened.v1"}, 50},
		{"aggregate", outbox.Filter{AggregateType: "test", AggregateID: "l-7"}, 5},
		{"dead", outbox.Filter{Status: outbox.StatusDead}, 1},
		{"held", outbox.Filter{Status: outbox.FilterHeld}, 4 + 4 + 4*28}, // every later event waits for its predecessor
		{"in flight", outbox.Filter{Status: outbox.FilterInFlight}, 1},
		{"pending", outbox.Filter{Status: outbox.StatusPending}, 149},
		{"error text, case and wildcards literal", outbox.Filter{Status: outbox.StatusDead, ErrorText: "100% no_route"}, 1},
		{"error text that does not match", outbox.Filter{Status: outbox.StatusDead, ErrorText: "100_ no"}, 0},
		{"created in the last hour", outbox.Filter{CreatedFrom: time.Now().Add(-time.Hour), CreatedTo: time.Now().Add(time.Minute)}, 150},
		{"created in the future", outbox.Filter{CreatedFrom: time.Now().Add(time.Hour)}, 0},
		{"id prefix", outbox.Filter{IDPrefix: strings.ToUpper(all[17].String()[:13])}, -1},
	} {
		got := listAll(t, ctx, pool, c.f, false, 4)
		n, err := outbox.Count(ctx, pool, c.f)
		if err != nil {
			t.Fatal(err)
		}
		if c.want >= 0 && (len(got) != c.want || n.N != int64(c.want) || n.Estimate) {
			t.Errorf("%s: listed %d, counted %+v, want %d", c.name, len(got), n, c.want)
		}
		if c.want < 0 && (!slices.Contains(got, all[17]) || int64(len(got)) != n.N) {
			t.Errorf("%s: listed %d (%v), counted %+v", c.name, len(got), got, n)
		}
	}
	// Row fields.
	page, err := outbox.List(ctx, pool, outbox.Filter{Status: outbox.StatusPending, AggregateType: "test", AggregateID: "l-4"}, outbox.Page{Oldest: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Rows) != 5 || page.Rows[0].Held || !page.Rows[1].InFlight || !page.Rows[1].Held || page.Rows[0].Topic != "payments" {
		t.Fatalf("rows %+v", page.Rows)
	}
	if page, err := outbox.List(ctx, pool, outbox.Filter{Status: outbox.StatusDead}, outbox.Page{}); err != nil || page.Rows[0].LastError != "Broker said: 100% NO_ROUTE" {
		t.Fatalf("dead row %+v (%v)", page.Rows, err)
	}
}

func TestListRefusesBadFiltersAndCursors(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	bulkInsert(t, pool, "c", 10, 2)
	for _, f := range []outbox.Filter{
		{Status: "stuck"},
		{AggregateID: "c-1"},
		{IDPrefix: "xyz"},
		{IDPrefix: strings.Repeat("a", 33)},
		{ErrorText: "timeout"},                           // unbounded scan of history
		{Status: outbox.StatusPublished, ErrorText: "x"}, // still history
		{ErrorText: "x", CreatedFrom: time.Now().Add(-48 * time.Hour), CreatedTo: time.Now()},
		{CreatedFrom: time.Now(), CreatedTo: time.Now().Add(-time.Hour)},
	} {
		if _, err := outbox.List(ctx, pool, f, outbox.Page{}); !errors.Is(err, outbox.ErrInvalidFilter) {
			t.Errorf("filter %+v: %v, want ErrInvalidFilter", f, err)
		}
	}
	now := time.Now()
	if _, err := outbox.List(ctx, pool, outbox.Filter{ErrorText: "x", CreatedFrom: now.Add(-time.Hour), CreatedTo: now}, outbox.Page{}); err != nil {
		t.Errorf("an hour's error search was refused: %v", err)
	}
	f := outbox.Filter{Topic: "test.topic"}
	page, err := outbox.List(ctx, pool, f, outbox.Page{Limit: 3})
	if err != nil || page.Next == "" {
		t.Fatalf("first page: %v, next %q", err, page.Next)
	}
	// A cursor is a position: one with another id is just another place
	// in the same list. Its version, order and filter fingerprint are
	// checked; change one and the cursor is refused.
	tampered := []byte(page.Next)
	tampered[len(tampered)-2] ^= 1
	for name, c := range map[string]struct {
		f      outbox.Filter
		cursor string
		oldest bool
	}{
		"tampered":      {f, string(tampered), false},
		"garbage":       {f, "'; DROP TABLE outbox_event; --", false},
		"empty-ish":     {f, "AA", false},
		"other filter":  {outbox.Filter{Topic: "other"}, page.Next, false},
		"other order":   {f, page.Next, true},
		"padded base64": {f, page.Next + "==", false},
		// Go's base64 decoder skips line breaks: one cursor, one spelling.
		"line break": {f, page.Next[:5] + "\r\n" + page.Next[5:], false},
	} {
		if _, err := outbox.List(ctx, pool, c.f, outbox.Page{Limit: 3, After: c.cursor, Oldest: c.oldest}); !errors.Is(err, outbox.ErrInvalidCursor) {
			t.Errorf("%s cursor: %v, want ErrInvalidCursor", name, err)
		}
	}
}

func TestDetailOfAMissingEvent(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	if _, err := outbox.Detail(context.Background(), pool, uuid.Must(uuid.NewV7())); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Detail of a missing event: %v, want ErrNotFound", err)
	}
}

// The list's page and count, and a dry run's count, are planned for their
// values on every call (db.PlanEachCall): none is kept as a prepared
// statement, whose generic plan PostgreSQL may switch to after five runs
// (a plan for no topic in particular, which cannot know that a topic and
// an event type never occur together).
func TestListIsPlannedForItsValues(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	bulkInsert(t, pool, "p", 20, 5)
	if _, err := pool.Exec(ctx, `UPDATE outbox_event SET status = 'dead', dead_at = now() WHERE aggregate_seq = 1`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// The seeding may have prepared statements on this connection.
	if err := conn.Conn().DeallocateAll(ctx); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"test.topic", "other", "test.topic", "none", "test.topic", "other", "none"} {
		for _, f := range []outbox.Filter{{Topic: topic}, {Topic: topic, EventType: "test.happened.v1"}, {Topic: topic, Status: outbox.FilterHeldDead}} {
			if _, err := outbox.List(ctx, conn, f, outbox.Page{Limit: 5}); err != nil {
				t.Fatal(err)
			}
			if _, err := outbox.Count(ctx, conn, f); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := outbox.Preview(ctx, conn, outbox.JobRetry, outbox.Filter{Topic: topic}, 5); err != nil {
			t.Fatal(err)
		}
		if _, err := outbox.CountPublishedBefore(ctx, conn, outbox.Filter{Topic: topic}, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if stmts := dbtest.Prepared(t, conn, "outbox_event"); len(stmts) > 0 {
		t.Fatalf("kept as prepared statements (a generic plan may serve them):\n%s", strings.Join(stmts, "\n"))
	}
}

// In flight is counted, never estimated: the planner has no statistics for
// a lease against the clock and would guess a third of the pending events
// (13,000 here, where 500 are in flight).
func TestInFlightIsCountedNotGuessed(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, locked_until, lock_token)
		SELECT gen_random_uuid(), 'test', 'a' || g, 1, 'test.topic', 'test.happened.v1', '{}',
		       CASE WHEN g <= 500 THEN now() + interval '1 hour' END, CASE WHEN g <= 500 THEN gen_random_uuid() END
		  FROM generate_series(1, 40000) g;
		ANALYZE outbox_event`); err != nil {
		t.Fatal(err)
	}
	if n, err := outbox.Count(ctx, pool, outbox.Filter{Status: outbox.FilterInFlight}); err != nil || n != (outbox.Total{N: 500}) {
		t.Fatalf("in flight: %+v (%v), want exactly 500", n, err)
	}
}
