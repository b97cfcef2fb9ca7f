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
// poison. A third phase drains the poisoned preload into a real broker that
// goes down for 30 s (10 s quick) part-way (r4outage.go).

func init() { register(40, "r4", runR4) }

const (
	r4MaxAttempts = 3
	r4Every       = 400
	poisonHeader  = "bench-poison"
)

var r4Backoff = outbox.Backoff{Base: 50 * time.Millisecond, Cap: 200 * time.Millisecond}

// r4RecoveryGoal is what the configuration implies between the broker's
// return and the first publish: natsbroker's reconnect wait (500 ms) and
// nats.go's jitter (≤ 100 ms), then at most the backoff cap before an
// event parked by the outage may be claimed again, plus one claim and one
// publish.
const r4RecoveryGoal = time.Second

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
	poisonHeaders := func(i int) []byte {
		if poisoned(i) {
			return []byte(`{"` + poisonHeader + `":"1"}`)
		}
		return []byte(`{}`)
	}
	outage := time.Duration(e.size(30, 10)) * time.Second
	oCfg := fmt.Sprintf("%s, into JetStream, broker down %v", rate.Config, outage)
	oBefore := &wlResult{Workload: "R4", Metric: "outage: healthy events/s before the outage", System: "relay", Config: oCfg, Unit: "ev/s"}
	oAfter := &wlResult{Workload: "R4", Metric: "outage: healthy events/s after the broker's return", System: "relay", Config: oCfg, Unit: "ev/s"}
	oResume := &wlResult{Workload: "R4", Metric: "outage: broker back → first publish", System: "relay", Config: oCfg, Unit: "s"}
	oDrained := &wlResult{Workload: "R4", Metric: "outage: broker back → backlog drained", System: "relay", Config: oCfg, Unit: "s"}
	oDead := &wlResult{Workload: "R4", Metric: "outage: healthy events dead", System: "relay", Config: oCfg, Unit: "events"}
	oDetails := map[string]any{"backlog_at_down": []int{}, "backlog_at_back": []int{}, "poison_alive_at_down": []int{},
		"unavailable_failures": []int64{}, "other_failures": []int64{}, "refused": []int64{}, "published_with_attempts_not_1": []int{},
		"inversions": []int64{}, "duplicates": []int64{}}
	outageOK, recoveredOK := true, true
	for r := 0; r < e.o.runs; r++ {
		for _, withPoison := range []bool{false, true} {
			if err := preloadSkewed(ctx, pool, plan, func(i int) []byte {
				if withPoison {
					return poisonHeaders(i)
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
		o, err := r4Outage(ctx, pool, e, plan, poisonHeaders, healthy, poison, held, outage)
		if err != nil {
			return fmt.Errorf("outage: %w", err)
		}
		fmt.Printf("  run %d outage %v: healthy %.0f ev/s before, %.0f ev/s after; back → first publish %v, → drained %v; backlog %d at down, %d at back; %d poison alive at down; %d unavailable, %d other failures %q; %d arrived, %d duplicates, %d inversions, %d refused, %d dead (%d healthy, %d with attempts ≠ %d), %d published with attempts ≠ 1, %d held; relay stats %+v\n",
			r+1, outage, o.before, o.after, o.resume.Round(time.Millisecond), o.drained.Round(time.Millisecond), o.backlogAtDown, o.backlogAtBack, o.poisonAlive,
			o.unavailable, o.other, o.otherErr, o.arrived, o.dups, o.inversions, o.refused, o.dead, o.deadHealthy, o.deadWrongAttempts, r4MaxAttempts, o.publishedRetried, o.pending, o.stats)
		outageOK = outageOK && o.correct()
		recoveredOK = recoveredOK && o.resume > 0 && o.resume <= r4RecoveryGoal
		oBefore.Runs = append(oBefore.Runs, o.before)
		oAfter.Runs = append(oAfter.Runs, o.after)
		oResume.Runs = append(oResume.Runs, o.resume.Seconds())
		oDrained.Runs = append(oDrained.Runs, o.drained.Seconds())
		oDead.Runs = append(oDead.Runs, float64(o.deadHealthy))
		oDetails["backlog_at_down"] = append(oDetails["backlog_at_down"].([]int), o.backlogAtDown)
		oDetails["backlog_at_back"] = append(oDetails["backlog_at_back"].([]int), o.backlogAtBack)
		oDetails["poison_alive_at_down"] = append(oDetails["poison_alive_at_down"].([]int), o.poisonAlive)
		oDetails["unavailable_failures"] = append(oDetails["unavailable_failures"].([]int64), o.unavailable)
		oDetails["other_failures"] = append(oDetails["other_failures"].([]int64), o.other)
		oDetails["refused"] = append(oDetails["refused"].([]int64), o.refused)
		oDetails["published_with_attempts_not_1"] = append(oDetails["published_with_attempts_not_1"].([]int), o.publishedRetried)
		oDetails["inversions"] = append(oDetails["inversions"].([]int64), o.inversions)
		oDetails["duplicates"] = append(oDetails["duplicates"].([]int64), o.dups)
	}
	e.add(base)
	e.add(rate).against(base.settle())
	e.add(deadAt).goal(fmt.Sprintf("each poison refused %d× then dead; %d held; 0 inversions", r4MaxAttempts, held), correct)
	e.add(oBefore)
	e.add(oAfter).against(oBefore)
	oDead.Details = oDetails
	e.add(oDead).goal(fmt.Sprintf("0 healthy dead; each poison refused %d× then dead; published events attempts 1; 0 inversions", r4MaxAttempts), outageOK)
	e.add(oResume).goal(fmt.Sprintf("≤ %v", r4RecoveryGoal), recoveredOK)
	e.add(oDrained)
	e.note("r4", "outage phase: the same poison preload drained by the same relays into embedded NATS JetStream (file store) through natsbroker; once the sink has refused as many publishes as there are poison events (the poison events are part-way through their attempts), the server is shut down for %v and started again on the same port and store; the relays see natsbroker's own errors (broker.ErrUnavailable while disconnected) and its client reconnects every 500 ms (+ up to 100 ms jitter). Recovery goal %v = reconnect wait + jitter (0.6 s) + the relay's backoff cap in R4 (%v) + a claim and publish; with the product's default backoff cap (5 min) an event's wait after an outage grows with the relay's run of failed batches and recovery can take up to that cap. \"Drained\" = every healthy event at the sink and every poison event dead; the backlog (healthy events not yet arrived) at the outage's start and at the broker's return are in details", outage, r4RecoveryGoal, r4Backoff.Cap)
	e.note("r4", "%d events in %d aggregates (R1's shape); poison = the first event of every %dth aggregate (%d events, 1 in %d), refused by the sink with a plain error; relay backoff %v–%v, %d attempts (bench settings, the defaults are 1 s–5 min and 10); the held events are the poisoned aggregates' later events, kept behind their dead letter by ordering", rows, a, r4Every/eventsPerAggregate, poison, r4Every, r4Backoff.Base, r4Backoff.Cap, r4MaxAttempts)
	return nil
}

// r4Drain runs the relays until the sink holds want events (flowing) and
// deadWant events are dead (dead).
func r4Drain(ctx context.Context, pool *pgxpool.Pool, sink *probeSink, e *workloadEnv, want, deadWant int) (flowing, dead time.Duration, stats []outbox.RelayStats, err error) {
	rs, err := r4Relays(pool, sink, e)
	if err != nil {
		return 0, 0, nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
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

// r4Relays are R4's relays (bench settings: poll 5 ms, no LISTEN, 3 attempts,
// 50–200 ms backoff; lease and publish timeout at their defaults).
func r4Relays(pool *pgxpool.Pool, pub outbox.Publisher, e *workloadEnv) ([]*outbox.Relay, error) {
	var rs []*outbox.Relay
	for i := range e.o.relays {
		r, err := outbox.NewRelay(pool, pub, outbox.RelayConfig{Name: fmt.Sprintf("r4-%d", i), BatchSize: e.o.batch,
			DisableListen: true, PollInterval: 5 * time.Millisecond, MaxAttempts: r4MaxAttempts, Backoff: r4Backoff}, nil, nil)
		if err != nil {
			return nil, err
		}
		rs = append(rs, r)
	}
	return rs, nil
}
