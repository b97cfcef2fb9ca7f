package live_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/internal/outbox/outboxtest"
)

// cutQuerier is the pool, or, cut, a database that does not answer
// (nothing listens where dead connects).
type cutQuerier struct {
	pool, dead live.Querier
	cut        *atomic.Bool
}

func (q cutQuerier) use() live.Querier {
	if q.cut.Load() {
		return q.dead
	}
	return q.pool
}

func (q cutQuerier) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return q.use().QueryRow(ctx, sql, args...)
}

func (q cutQuerier) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return q.use().SendBatch(ctx, b)
}

// A clock the test moves.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// When the database stops answering, the last figures read are marked as
// from before the outage, on the pages at once (a fragment pushed with the
// first failure) and in /metrics, which leaves the snapshot's gauges out
// past StaleAfter and always says the snapshot's age. An outage drill saw
// the dashboard and /metrics show frozen figures as current for 40 s, the
// indicator saying "live".
func TestAnUnreachableDatabaseIsShownNotHidden(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	outboxtest.Insert(t, pool, outboxtest.Seed{Topic: "t", Status: "dead", Attempts: 3})
	cut := &atomic.Bool{}
	clock := &testClock{now: time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)}
	dead, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dead.Close)
	f := live.New(cutQuerier{pool, dead, cut}, nil, live.Config{Now: clock.Now, Render: func(s live.Snapshot, _ []live.Snapshot) ([]live.Fragment, error) {
		return []live.Fragment{{ID: "updated", HTML: []byte("unreachable since " + s.Unreachable.Format(time.TimeOnly))}}, nil
	}})
	reg := prometheus.NewRegistry()
	if err := f.Register(reg); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := f.Step(ctx); err != nil {
		t.Fatal(err)
	}
	c := f.Subscribe("s")
	<-c.Messages() // the full state on subscribe
	gauges := func() map[string]float64 { t.Helper(); return gaugesOf(t, reg) }
	if g := gauges(); g["sluice_outbox_dead_letter"] != 1 || g["sluice_console_snapshot_age_seconds"] != 0 {
		t.Fatalf("while the database answers: %v", g)
	}

	cut.Store(true)
	clock.Add(2 * time.Second)
	if err := f.Step(ctx); err == nil {
		t.Fatal("a snapshot was read from a database that does not answer")
	}
	s, _ := f.Latest()
	if !s.Unreachable.Equal(clock.Now()) || s.Dead != 1 {
		t.Fatalf("latest after the first failure: unreachable %v (want %v), dead %d", s.Unreachable, clock.Now(), s.Dead)
	}
	select {
	case msg := <-c.Messages():
		if !strings.Contains(string(msg), "unreachable since 12:00:02") {
			t.Fatalf("the page was sent %q", msg)
		}
	default:
		t.Fatal("the page was not told the database stopped answering")
	}
	if g := gauges(); g["sluice_outbox_dead_letter"] != 1 || g["sluice_console_snapshot_age_seconds"] != 2 {
		t.Fatalf("a failed read or two leaves the gauges in: %v", g)
	}
	clock.Add(live.StaleAfter)
	if err := f.Step(ctx); err == nil {
		t.Fatal("a snapshot was read from a database that does not answer")
	}
	select {
	case msg := <-c.Messages():
		t.Fatalf("the same outage was pushed again: %q", msg)
	default:
	}
	g := gauges()
	if _, ok := g["sluice_outbox_dead_letter"]; ok || g["sluice_console_snapshot_age_seconds"] < live.StaleAfter.Seconds() {
		t.Fatalf("past StaleAfter the snapshot's gauges stay in, or the age is wrong: %v", g)
	}

	cut.Store(false)
	if err := f.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if s, _ := f.Latest(); !s.Unreachable.IsZero() {
		t.Fatalf("still unreachable after a read: %v", s.Unreachable)
	}
	if g := gauges(); g["sluice_outbox_dead_letter"] != 1 || g["sluice_console_snapshot_age_seconds"] != 0 {
		t.Fatalf("after the database answers again: %v", g)
	}
}

// A read that waits for ever (the pool's every connection held, say, by
// requests waiting on a lock) fails after ReadTimeout and marks the figures
// as from before; /metrics leaves the snapshot's gauges out once it is
// older than StaleAfter whatever the reason, and says its age from the
// feed's start before any snapshot was read (a review found the gauges
// frozen behind a held connection, and no age before the first read).
func TestAHangingReadIsMarkedAndAgeIsAlwaysThere(t *testing.T) {
	t.Parallel()
	owner := dbtest.New(t)
	outboxtest.Insert(t, owner, outboxtest.Seed{Topic: "t", Status: "dead", Attempts: 3})
	cfg := owner.Config()
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	clock := &testClock{now: time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)}
	f := live.New(pool, nil, live.Config{Now: clock.Now, ReadTimeout: 300 * time.Millisecond})
	reg := prometheus.NewRegistry()
	if err := f.Register(reg); err != nil {
		t.Fatal(err)
	}
	gauges := func() map[string]float64 { t.Helper(); return gaugesOf(t, reg) }
	clock.Add(20 * time.Second)
	if g := gauges(); g["sluice_console_snapshot_age_seconds"] != 20 {
		t.Fatalf("before the first snapshot: %v, want the age since the feed started", g)
	}
	ctx := context.Background()
	if err := f.Step(ctx); err != nil {
		t.Fatal(err)
	}
	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	done := make(chan error, 1)
	go func() { done <- f.Step(ctx) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a snapshot was read through a pool whose one connection is held")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the read waits for ever")
	}
	if s, _ := f.Latest(); s.Unreachable.IsZero() || s.Dead != 1 {
		t.Fatalf("after a read that could not end: unreachable %v, dead %d", s.Unreachable, s.Dead)
	}
	clock.Add(live.StaleAfter + time.Second)
	g := gauges()
	if _, ok := g["sluice_outbox_dead_letter"]; ok || g["sluice_console_snapshot_age_seconds"] <= live.StaleAfter.Seconds() {
		t.Fatalf("past StaleAfter: %v", g)
	}
}

// A feed set to tick slower than StaleAfter keeps its gauges between two
// healthy ticks (a review: with CONSOLE_LIVE_TICK at 16 s they vanished
// after every read).
func TestASlowTickKeepsItsGauges(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	clock := &testClock{now: time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)}
	f := live.New(pool, nil, live.Config{Now: clock.Now, Interval: 20 * time.Second})
	reg := prometheus.NewRegistry()
	if err := f.Register(reg); err != nil {
		t.Fatal(err)
	}
	if err := f.Step(context.Background()); err != nil {
		t.Fatal(err)
	}
	clock.Add(19 * time.Second) // the next tick is a second away
	if _, found := gaugesOf(t, reg)["sluice_outbox_dead_letter"]; !found {
		t.Fatal("a healthy feed ticking every 20 s lost its gauges between two ticks")
	}
}

// gaugesOf is every unlabelled gauge reg gathers, by name (a labelled one:
// its last series).
func gaugesOf(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			out[mf.GetName()] = m.GetGauge().GetValue()
		}
	}
	return out
}
