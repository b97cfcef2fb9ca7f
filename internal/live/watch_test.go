package live_test

import (
	"context"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/outbox/outboxtest"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
)

// statementCounter counts every statement the feed sends (a batch is one
// round trip: the snapshot with its plan settings).
type statementCounter struct {
	q live.Querier
	n atomic.Int64
}

func (c *statementCounter) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.n.Add(1)
	return c.q.QueryRow(ctx, sql, args...)
}

func (c *statementCounter) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	c.n.Add(1)
	return c.q.SendBatch(ctx, b)
}

// N sockets watching M records (events and payments, several sockets per
// record) cost one statement per tick besides the snapshot, whatever N and
// M; no socket watching a record costs none. Every socket finds its
// record's state without a query of its own.
func TestWatchedRecordsCostOneStatementPerTick(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	lastError := "nats: no responders"
	events := outboxtest.Insert(t, pool, outboxtest.Seed{N: 7, Status: "dead", Attempts: 3, LastError: lastError})
	account := paymentstest.Account(t, pool, paymentstest.AccountOpts{ID: 1, Balance: "1000"})
	var pays []uuid.UUID
	for range 5 {
		pays = append(pays, paymentstest.Payment(t, pool, paymentstest.PaymentOpts{Account: account}))
	}
	counter := &statementCounter{q: pool}
	f := live.New(counter, nil, live.Config{})
	if err := f.Step(ctx); err != nil {
		t.Fatal(err)
	}
	// Dashboard sockets only: one statement per tick, the snapshot.
	f.Subscribe("s")
	n0 := counter.n.Load()
	for range 3 {
		if err := f.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := counter.n.Load() - n0; got != 3 {
		t.Fatalf("%d statements for 3 ticks with no record watched, want 3 (the snapshots)", got)
	}

	// 36 sockets on 12 records: three per record.
	type watcher struct {
		c *live.Client
		w live.Watch
	}
	var ws []watcher
	for range 3 {
		for _, id := range events {
			w := live.Watch{Kind: live.KindEvent, ID: id}
			ws = append(ws, watcher{f.SubscribeRecord("s", w), w})
		}
		for _, id := range pays {
			w := live.Watch{Kind: live.KindPayment, ID: id}
			ws = append(ws, watcher{f.SubscribeRecord("s", w), w})
		}
	}
	q0, watched, refused := f.WatchStats()
	if watched[live.KindEvent] != 7 || watched[live.KindPayment] != 5 || refused != 0 {
		t.Fatalf("watched %v refused %d, want 7 events and 5 payments", watched, refused)
	}
	n0 = counter.n.Load()
	const ticks = 5
	for range ticks {
		if err := f.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	q1, _, _ := f.WatchStats()
	if got := counter.n.Load() - n0; got != 2*ticks || q1-q0 != ticks {
		t.Fatalf("%d statements (%d of records) for %d ticks with %d sockets on 12 records, want one snapshot and one record read per tick",
			got, q1-q0, ticks, len(ws))
	}
	for _, w := range ws {
		s, ok := f.Record(w.c)
		if !ok || !s.Found || s.At.IsZero() {
			t.Fatalf("%v: no state (%v %+v)", w.w, ok, s)
		}
		switch w.w.Kind {
		case live.KindEvent:
			if e := s.Event; e.ID != w.w.ID || e.Status != outbox.StatusDead || e.Attempts != 3 ||
				e.LastError != outbox.ErrorDigest(&lastError) || e.InFlight || e.PublishedAt != nil {
				t.Fatalf("event state %+v", e)
			}
		case live.KindPayment:
			if p := s.Payment; p.OperationID != w.w.ID || p.Status != payments.StatusUnknown || p.Resolver != "" || p.Approval != 0 {
				t.Fatalf("payment state %+v", p)
			}
		}
		if got := len(drain(w.c)); got != 0 {
			t.Fatalf("a record socket got %d bytes: its messages are empty ticks", got)
		}
	}

	// Every socket gone: the statement goes too.
	for _, w := range ws {
		f.Unsubscribe(w.c)
	}
	if _, watched, _ := f.WatchStats(); watched[live.KindEvent] != 0 || watched[live.KindPayment] != 0 {
		t.Fatalf("still watched after every socket left: %v", watched)
	}
	n0 = counter.n.Load()
	if err := f.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if got := counter.n.Load() - n0; got != 1 {
		t.Fatalf("%d statements for a tick with no record watched", got)
	}
}

// A record that is gone (a published event pruned) is read as not found,
// not left out: its page may say so.
func TestAWatchedRecordGoneIsNotFound(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	f := live.New(pool, nil, live.Config{})
	gone := uuid.Must(uuid.NewV7())
	c := f.SubscribeRecord("s", live.Watch{Kind: live.KindEvent, ID: gone})
	if _, ok := f.Record(c); ok {
		t.Fatal("a state before any read")
	}
	if err := f.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if s, ok := f.Record(c); !ok || s.Found {
		t.Fatalf("a missing event reads %+v (%v), want read and not found", s, ok)
	}
}

// Beyond MaxWatched records of a kind, a socket is subscribed without its
// record: it gets its ticks and no state (its page says nothing), the read
// stays at MaxWatched ids, and a place freed is taken by the next socket.
func TestWatchedRecordsAreCapped(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	f := live.New(pool, nil, live.Config{})
	if err := f.Step(ctx); err != nil {
		t.Fatal(err)
	}
	var clients []*live.Client
	first := uuid.Must(uuid.NewV7())
	for i := range live.MaxWatched {
		id := first
		if i > 0 {
			id = uuid.Must(uuid.NewV7())
		}
		clients = append(clients, f.SubscribeRecord("s", live.Watch{Kind: live.KindEvent, ID: id}))
	}
	// Another socket on a record already watched costs no place.
	same := f.SubscribeRecord("s", live.Watch{Kind: live.KindEvent, ID: first})
	over := f.SubscribeRecord("s", live.Watch{Kind: live.KindEvent, ID: uuid.Must(uuid.NewV7())})
	payment := f.SubscribeRecord("s", live.Watch{Kind: live.KindPayment, ID: uuid.Must(uuid.NewV7())})
	if !same.Watching() || over.Watching() || !payment.Watching() {
		t.Fatalf("watching: same record %v, one over the cap %v, another kind %v", same.Watching(), over.Watching(), payment.Watching())
	}
	if _, watched, refused := f.WatchStats(); watched[live.KindEvent] != live.MaxWatched || refused != 1 {
		t.Fatalf("watched %v refused %d", watched, refused)
	}
	drain(over)
	if err := f.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.Record(over); ok {
		t.Fatal("a socket over the cap has a state")
	}
	if m := drain(over); m != "" {
		t.Fatalf("a socket over the cap got %q", m)
	}
	select {
	case <-over.Done():
		t.Fatal("a socket over the cap was closed")
	default:
	}
	if _, ok := f.Record(clients[1]); !ok {
		t.Fatal("a watched record has no state")
	}
	f.Unsubscribe(clients[1])
	next := f.SubscribeRecord("s", live.Watch{Kind: live.KindEvent, ID: uuid.Must(uuid.NewV7())})
	if !next.Watching() {
		t.Fatal("a place freed is not taken")
	}
}

// The watched records' statement reads each table by its primary key (and
// a payment's newest request by payment_approval_op_idx), on the plan a
// connection first runs it with (custom) and on the generic one it may
// keep: never a scan of a table. Asserted for a hundred records of each
// kind on tables of 20,000 rows; the plans for MaxWatched are logged (at
// 5% of so small a table a scan of payment is the planner's right choice,
// which a table of production size does not make).
func TestWatchedRecordsPlanReadsByPrimaryKey(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	events := outboxtest.Insert(t, pool, outboxtest.Seed{N: 20000, Status: "published", Age: time.Hour})
	account := paymentstest.Account(t, pool, paymentstest.AccountOpts{ID: 1, Balance: "1000"})
	pay := paymentstest.Payment(t, pool, paymentstest.PaymentOpts{Account: account})
	if _, err := pool.Exec(ctx, `
		INSERT INTO payment (operation_id, merchant_id, invoice_id, account_id, amount, currency, status)
		SELECT gen_random_uuid(), merchant_id, 'bulk-' || g, account_id, 1, currency, 'completed'
		  FROM payment, generate_series(1, 20000) g WHERE operation_id = $1`, pay); err != nil {
		t.Fatal(err)
	}
	// Decided four-eyes requests on a tenth of them.
	if _, err := pool.Exec(ctx, `
		INSERT INTO payment_approval (operation_id, outcome, reason, evidence, requested_by, state, decided_by, decided_at)
		SELECT operation_id, 'succeeded', 'r', 'e', 'a|1', 'rejected', 'b|2', now() FROM payment WHERE invoice_id LIKE 'bulk-%0'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE outbox_event; ANALYZE payment; ANALYZE payment_approval`); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT operation_id FROM payment ORDER BY random() LIMIT $1`, live.MaxWatched)
	if err != nil {
		t.Fatal(err)
	}
	pays, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	plans := func(n int) map[string]string {
		sql, args := live.RecordsQuery(events[:n], pays[:n])
		custom, err := pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		customLines, err := pgx.CollectRows(custom, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		// EXECUTE's arguments go as literals (the simple protocol), which
		// has no encoding of its own for a uuid array: its text form.
		literals := make([]any, len(args))
		for i, a := range args {
			ids := make([]string, 0, n)
			for _, id := range a.([]uuid.UUID) {
				ids = append(ids, id.String())
			}
			literals[i] = "{" + strings.Join(ids, ",") + "}"
		}
		generic, err := db.ExplainGeneric(ctx, pool, "ANALYZE, BUFFERS", sql, literals...)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{"custom": strings.Join(customLines, "\n"), "generic": strings.Join(generic, "\n")}
		for name, plan := range out {
			// The arrays' literals make lines of 40 kB: cut them.
			plan = regexp.MustCompile(`'\{[^}]{60,}\}'`).ReplaceAllString(plan, "'{…}'")
			out[name] = plan
			t.Logf("%s plan, %d events and %d payments of 20,000 each:\n%s", name, n, n, plan)
		}
		return out
	}
	for name, plan := range plans(100) {
		for _, idx := range []string{"using outbox_event_pkey on outbox_event", "on payment_pkey", "using payment_approval_op_idx"} {
			if !strings.Contains(plan, idx) {
				t.Errorf("%s plan does not read %s", name, idx)
			}
		}
		if m := regexp.MustCompile(`Seq Scan on \S+`).FindString(plan); m != "" {
			t.Errorf("%s plan: %s", name, m)
		}
	}
	plans(live.MaxWatched)
}
