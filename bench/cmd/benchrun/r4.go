package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// R4 poison: 1 event in 400 is refused by the sink every time. The relay
// (ordering on) backs off, retries and dead-letters it after r4MaxAttempts;
// the poisoned aggregate's later events stay held behind the dead letter
// (the product's ordering rule), every other aggregate keeps flowing.
// Baseline in the same run: the same relay on the same preload without
// poison. Not done yet: BENCH.md's 30 s broker outage.

func init() { register(40, "r4", runR4) }

const (
	r4MaxAttempts = 3
	r4Every       = 400
	poisonHeader  = "bench-poison"
)

var r4Backoff = outbox.Backoff{Base: 50 * time.Millisecond, Cap: 200 * time.Millisecond}

func runR4(ctx context.Context, e *workloadEnv) error {
	rows := e.size(e.o.rows, 20000)
	a := aggregates(rows)
	plan := make([]int, rows)
	for i := range plan {
		plan[i] = i % a // R1's shape: 10 events per aggregate, round-robin
	}
	// The first event of every 40th aggregate: rows/400 events.
	poisoned := func(i int) bool { return (i%a)%(r4Every/eventsPerAggregate) == 7 && i/a == 0 }
	var poison, held int
	for i := range plan {
		if poisoned(i) {
			poison++
			held += eventsPerAggregate - 1
		}
	}
	healthy := rows - poison - held
	pool, err := e.newDB("r4")
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrateSluice(ctx, pool); err != nil {
		return err
	}
	base := &wlResult{Workload: "R4", Metric: "no poison: events/s", System: "relay", Config: "no poison", Unit: "ev/s"}
	rate := &wlResult{Workload: "R4", Metric: fmt.Sprintf("1 in %d refused: healthy aggregates' events/s", r4Every), System: "relay",
		Config: fmt.Sprintf("%d relays, batch %d, ordered, %d attempts", e.o.relays, e.o.batch, r4MaxAttempts), Unit: "ev/s"}
	deadAt := &wlResult{Workload: "R4", Metric: fmt.Sprintf("time until all %d poison events are dead", poison), System: "relay", Config: rate.Config, Unit: "s"}
	correct := true
	for r := 0; r < e.o.runs; r++ {
		for _, withPoison := range []bool{false, true} {
			if err := preloadSkewed(ctx, pool, plan, func(i int) []byte {
				if withPoison && poisoned(i) {
					return []byte(`{"` + poisonHeader + `":"1"}`)
				}
				return []byte(`{}`)
			}); err != nil {
				return err
			}
			sink := newProbeSink(func(m broker.Message) bool { return m.Headers[poisonHeader] == "1" })
			want := rows
			if withPoison {
				want = healthy
			}
			flowing, dead, stats, err := r4Drain(ctx, pool, sink, e, want, map[bool]int{true: poison}[withPoison])
			if err != nil {
				return err
			}
			n, dups, inv := sink.counts()
			var pending int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE status = 'pending'`).Scan(&pending); err != nil {
				return err
			}
			fmt.Printf("  run %d poison %-5v: %d delivered in %.2fs (%.0f ev/s), dead after %.2fs, refused %d, duplicates %d, inversions %d, still pending (held) %d, relay stats %+v\n",
				r+1, withPoison, n, flowing.Seconds(), float64(n)/flowing.Seconds(), dead.Seconds(), sink.refused.Load(), dups, inv, pending, stats)
			if !withPoison {
				base.Runs = append(base.Runs, float64(rows)/flowing.Seconds())
				continue
			}
			correct = correct && n == healthy && inv == 0 && pending == held && sink.refused.Load() == int64(poison*r4MaxAttempts)
			rate.Runs = append(rate.Runs, float64(healthy)/flowing.Seconds())
			deadAt.Runs = append(deadAt.Runs, dead.Seconds())
		}
	}
	e.add(base)
	e.add(rate).against(base.settle())
	e.add(deadAt).goal(fmt.Sprintf("each poison refused %d× then dead; %d held; 0 inversions", r4MaxAttempts, held), correct)
	e.note("r4", "%d events in %d aggregates (R1's shape); poison = the first event of every %dth aggregate (%d events, 1 in %d), refused by the sink with a plain error; relay backoff %v–%v, %d attempts (bench settings, the defaults are 1 s–5 min and 10); the held events are the poisoned aggregates' later events, kept behind their dead letter by ordering", rows, a, r4Every/eventsPerAggregate, poison, r4Every, r4Backoff.Base, r4Backoff.Cap, r4MaxAttempts)
	return nil
}

// r4Drain runs the relays until the sink holds want events (flowing) and
// deadWant events are dead (dead).
func r4Drain(ctx context.Context, pool *pgxpool.Pool, sink *probeSink, e *workloadEnv, want, deadWant int) (flowing, dead time.Duration, stats []outbox.RelayStats, err error) {
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var rs []*outbox.Relay
	for i := range e.o.relays {
		r, err := outbox.NewRelay(pool, sink, outbox.RelayConfig{Name: fmt.Sprintf("r4-%d", i), BatchSize: e.o.batch,
			DisableListen: true, PollInterval: 5 * time.Millisecond, MaxAttempts: r4MaxAttempts, Backoff: r4Backoff}, nil, nil)
		if err != nil {
			cancel()
			return 0, 0, nil, err
		}
		rs = append(rs, r)
	}
	start := time.Now()
	for _, r := range rs {
		wg.Go(func() { _ = r.Run(rctx) })
	}
	defer func() {
		cancel()
		wg.Wait()
		for _, r := range rs {
			stats = append(stats, r.Stats())
		}
	}()
	tctx, tcancel := context.WithTimeout(ctx, 5*time.Minute)
	defer tcancel()
	if err := waitFor(tctx, func() (bool, error) { return sink.distinct() >= want, nil }); err != nil {
		return 0, 0, nil, fmt.Errorf("healthy events: %d of %d: %w", sink.distinct(), want, err)
	}
	flowing = time.Since(start)
	err = waitFor(tctx, func() (bool, error) {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE status = 'dead'`).Scan(&n)
		return n >= deadWant, err
	})
	return flowing, time.Since(start), stats, err
}
