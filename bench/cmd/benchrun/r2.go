package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// R2 open loop: a business transaction (update an account row, insert one
// event) at a fixed rate; latency is the sink's receive time minus the
// producer's commit time. The relay wakes on NOTIFY (outbox.Notifier poked
// after each commit, the product's path); River runs its best R1
// configuration at the same rates, the job inserted in the same kind of
// transaction.

func init() { register(20, "r2", runR2) }

const (
	r2Accounts  = 1000
	r2Producers = 16
)

// r2Rates parses -r2-rates.
func r2Rates(list string) ([]int, error) {
	var rates []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-r2-rates: %q is not a rate", f)
		}
		rates = append(rates, n)
	}
	return rates, nil
}

// r2DrainTimeout is how long after the last commit the sink may still
// receive; what has not arrived by then counts as lost for the run (the
// rate was not sustainable).
const r2DrainTimeout = 15 * time.Second

type r2Run struct {
	target, achieved float64
	lat              []float64 // ms, sorted
	lost             int       // committed, never arrived before the drain timeout
	drain            time.Duration
	backlogAtEnd     int
	perEvent         *r2Cost // fixed rates only
}

// r2Cost is the database's cost per committed event over one run: the
// producers' transactions and the relays' (or River's) work together.
type r2Cost struct {
	commits, wal, stmts float64 // stmts: 0 unless pg_stat_statements is loaded
}

func (r r2Run) sustainable() bool {
	return r.achieved >= 0.95*r.target && r.lost == 0 && r.drain <= 2*time.Second && pct(r.lat, 99) <= 1000
}

// why says which part of sustainable() failed.
func (r r2Run) why() string {
	var out []string
	if r.achieved < 0.95*r.target {
		out = append(out, fmt.Sprintf("producers reached %.0f/s", r.achieved))
	}
	if r.lost > 0 {
		out = append(out, fmt.Sprintf("%d not arrived", r.lost))
	}
	if r.drain > 2*time.Second {
		out = append(out, fmt.Sprintf("drain %v", r.drain.Round(time.Millisecond)))
	}
	if p := pct(r.lat, 99); p > 1000 {
		out = append(out, fmt.Sprintf("p99 %.0f ms", p))
	}
	return strings.Join(out, ", ")
}

// r2WarmSecs is the same load, not measured, that runs before each
// measured run, relay and River alike: the producers' connections are made
// and their statements prepared, the relays' (or River's) pool grows to what
// the rate needs, before the first measured commit. Without it a quick run's
// 5 s made the first second's setup (17 producer backends forked and warmed
// at once) the whole p99: events of that second waited up to 0.5 s, and a
// p99 is its worst 1 %, 50 events (bench/README "R2: the first second").
const r2WarmSecs = 1

// r2WarmUp runs the workload for r2WarmSecs and waits for it at the sink,
// then forgets it there.
func r2WarmUp(ctx context.Context, sink *probeSink, rate int, insert func(ctx context.Context, k int) (string, error)) error {
	warm, _, last, err := openLoop(ctx, rate, r2WarmSecs, insert)
	if err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	if w := r2Measure(ctx, sink, warm, 0, last, rate); w.lost > 0 {
		return fmt.Errorf("warm-up: %d of %d events not at the sink %v after the last commit", w.lost, len(warm), r2DrainTimeout)
	}
	sink.reset()
	return nil
}

// r2Step is the factor between two rates of the search for the highest
// sustainable rate.
const r2Step = 1.25

func runR2(ctx context.Context, e *workloadEnv) error {
	secs := e.size(60, 5)
	rates, err := r2Rates(e.o.r2Rates)
	if err != nil {
		return err
	}
	spool, err := e.newDB("r2")
	if err != nil {
		return err
	}
	defer spool.Close()
	if err := migrateSluice(ctx, spool); err != nil {
		return err
	}
	rpool, err := e.newDB("r2river")
	if err != nil {
		return err
	}
	defer rpool.Close()
	if err := migrateRiver(ctx, rpool); err != nil {
		return err
	}
	for _, p := range []*pgxpool.Pool{spool, rpool} {
		if _, err := p.Exec(ctx, `CREATE TABLE bench_account (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0)`); err != nil {
			return err
		}
		if _, err := p.Exec(ctx, `INSERT INTO bench_account (id) SELECT generate_series(1, $1)`, r2Accounts); err != nil {
			return err
		}
	}
	pgss := map[*pgxpool.Pool]bool{}
	for _, p := range []*pgxpool.Pool{spool, rpool} {
		// Statements per event only where pg_stat_statements is preloaded
		// (the view errors otherwise).
		if _, err := p.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err == nil {
			_, err = p.Exec(ctx, `SELECT count(*) FROM pg_stat_statements`)
			pgss[p] = err == nil
		}
	}
	one := func(sys string, rate, secs int, cost bool) (r2Run, error) {
		pool, table := spool, "outbox_event"
		if sys == "river" {
			pool, table = rpool, "river_job"
		}
		// The counters are read right before the open loop starts (after
		// the run's TRUNCATE and CHECKPOINT) and after its drain.
		var before stats
		costs := func(start bool, n int) (*r2Cost, error) {
			if !cost {
				return nil, nil
			}
			s, err := snapshot(ctx, pool, table, pgss[pool])
			if err != nil || start {
				before = s
				return nil, err
			}
			if n == 0 {
				return nil, nil
			}
			return &r2Cost{commits: float64(s.commits-before.commits) / float64(n), wal: float64(s.wal-before.wal) / float64(n),
				stmts: float64(s.stmts-before.stmts) / float64(n)}, nil
		}
		var res r2Run
		var err error
		if sys == "relay" {
			res, err = r2Relay(ctx, e, spool, rate, secs, costs)
		} else {
			res, err = r2River(ctx, rpool, rate, secs, costs)
		}
		if err != nil {
			return r2Run{}, fmt.Errorf("%s at %d/s: %w", sys, rate, err)
		}
		return res, nil
	}
	show := func(label string, r int, sys string, rate int, res r2Run) {
		fmt.Printf("  run %d %-6s %-5s %5d ev/s target, %6.0f achieved: p50 %6.1f ms p99 %7.1f ms p99.9 %7.1f ms, drain %v, not arrived %d, sustainable %v %s\n",
			r+1, label, sys, rate, res.achieved, pct(res.lat, 50), pct(res.lat, 99), pct(res.lat, 99.9), res.drain.Round(time.Millisecond), res.lost, res.sustainable(), res.why())
	}
	runs := map[string][]r2Run{}
	for r := 0; r < e.o.runs; r++ {
		for _, rate := range rates {
			for _, sys := range []string{"relay", "river"} {
				res, err := one(sys, rate, secs, true)
				if err != nil {
					return err
				}
				key := sys + strconv.Itoa(rate)
				runs[key] = append(runs[key], res)
				show("fixed", r, sys, rate, res)
			}
		}
	}
	// The search: from each run's highest sustained fixed rate, ×r2Step per
	// step (relay and River alternately, the same steps and definition)
	// until a rate is not sustainable or the steps run out.
	steps := e.size(8, 6)
	if e.o.r2Steps >= 0 {
		steps = e.o.r2Steps
	}
	searched := map[string][]float64{}
	tried := map[string][]string{}
	capped := map[string]bool{}
	for r := 0; r < e.o.runs; r++ {
		last, live := map[string]int{}, map[string]bool{}
		for _, sys := range []string{"relay", "river"} {
			for _, rate := range rates {
				if runs[sys+strconv.Itoa(rate)][r].sustainable() {
					last[sys] = rate
				}
			}
			live[sys] = last[sys] > 0
		}
		for step := 1; step <= steps && (live["relay"] || live["river"]); step++ {
			for _, sys := range []string{"relay", "river"} {
				if !live[sys] {
					continue
				}
				rate := int(math.Round(float64(last[sys]) * r2Step))
				res, err := one(sys, rate, secs, false)
				if err != nil {
					return err
				}
				show("search", r, sys, rate, res)
				mark := "✓"
				if res.sustainable() {
					last[sys] = rate
				} else {
					live[sys] = false
					mark = "✗ " + res.why()
				}
				tried[sys] = append(tried[sys], fmt.Sprintf("run %d: %d/s p99 %.0f ms %s", r+1, rate, pct(res.lat, 99), mark))
			}
		}
		for _, sys := range []string{"relay", "river"} {
			searched[sys] = append(searched[sys], float64(last[sys]))
			if live[sys] {
				capped[sys] = true
				tried[sys] = append(tried[sys], fmt.Sprintf("run %d: stopped after %d steps, still sustainable", r+1, steps))
			}
		}
	}
	highest := map[string]int{}
	for _, rate := range rates {
		var base99 *wlResult
		for _, sys := range []string{"river", "relay"} {
			rs := runs[sys+strconv.Itoa(rate)]
			p50, p99, p999, ach := &wlResult{}, &wlResult{}, &wlResult{}, 0.0
			sustainable := true
			var backlog, notArrived, drainMS, commits, wal, stmts []float64
			for _, r := range rs {
				if r.perEvent != nil {
					commits, wal = append(commits, r.perEvent.commits), append(wal, r.perEvent.wal)
					if r.perEvent.stmts > 0 {
						stmts = append(stmts, r.perEvent.stmts)
					}
				}
				backlog = append(backlog, float64(r.backlogAtEnd))
				notArrived = append(notArrived, float64(r.lost))
				drainMS = append(drainMS, ms(r.drain))
				p50.Runs = append(p50.Runs, pct(r.lat, 50))
				p99.Runs = append(p99.Runs, pct(r.lat, 99))
				p999.Runs = append(p999.Runs, pct(r.lat, 99.9))
				ach += r.achieved / float64(len(rs))
				sustainable = sustainable && r.sustainable()
			}
			if sustainable {
				highest[sys] = max(highest[sys], rate)
			}
			cfg := fmt.Sprintf("%d relays, batch %d, ordered, LISTEN + Notifier", e.o.relays, e.o.batch)
			if sys == "river" {
				cfg = riverConfigs[0].Name
			}
			details := map[string]any{"achieved_rate": ach, "sustainable": sustainable, "seconds": secs,
				"p50_ms": p50.settle().Median, "p99_9_ms": p999.settle().Median,
				"backlog_at_last_commit": backlog, "not_arrived": notArrived, "drain_after_last_commit_ms": drainMS,
				"commits_per_event": commits, "wal_bytes_per_event": wal}
			if len(stmts) > 0 {
				details["statements_per_event"] = stmts
			}
			*p99 = wlResult{Workload: "R2", Metric: fmt.Sprintf("p99 at %d/s (got %.0f/s; p50 %s ms)", rate, ach, fmtVal(p50.Median)),
				System: sys, Config: cfg, Unit: "ms", Runs: p99.Runs, Details: details}
			p99.settle()
			if sys == "river" {
				base99 = p99
				e.add(p99)
				continue
			}
			p99.against(base99)
			if rate == 1000 {
				p99.goal("p99 ≤ 25 ms", p99.Median <= 25 && sustainable)
			}
			e.add(p99)
		}
	}
	metric := fmt.Sprintf("highest sustainable rate (×%.2f steps from %v)", r2Step, rates)
	hi := &wlResult{Workload: "R2", Metric: metric, System: "relay", Unit: "ev/s", Runs: searched["relay"],
		Details: map[string]any{"highest_fixed_sustained_in_every_run": highest["relay"], "search": tried["relay"]}}
	hriver := &wlResult{Workload: "R2", Metric: metric, System: "river", Config: riverConfigs[0].Name, Unit: "ev/s", Runs: searched["river"],
		Details: map[string]any{"highest_fixed_sustained_in_every_run": highest["river"], "search": tried["river"]}}
	for _, r := range []*wlResult{hi, hriver} {
		if capped[r.System] {
			r.Config = strings.TrimPrefix(r.Config+", ", ", ") + "steps ran out: a lower bound"
		}
	}
	e.add(hriver)
	e.add(hi).against(hriver.settle())
	for _, sys := range []string{"relay", "river"} {
		fmt.Printf("  search %s: %s\n", sys, strings.Join(tried[sys], "; "))
	}
	e.note("r2", "%d s per rate after %d s of the same load not measured (warm connections for both systems), %d producers (own pool), 1 KB payload, %d accounts; latency = first arrival at an in-process sink − the producer's commit return; sustainable = ≥95%% of the rate achieved, nothing lost, drained ≤ 2 s after the last commit, p99 ≤ 1 s; events not at the sink %v after the last commit count as lost. Highest sustainable rate: after the fixed rates, each run steps up ×%.2f from that run's highest sustained fixed rate (%d s per step, at most %d steps), relay and River alternately, until a rate is not sustainable; the row is the last sustained rate (the steps and why the last one failed are in details: often the producers, not the relay, stop keeping up). Commits and WAL bytes per event (fixed rates, details): deltas of pg_stat_database.xact_commit of the system's database (producers and relays together) and of pg_current_wal_lsn (cluster-wide: includes other users of a shared server) ÷ committed events; statements per event only when pg_stat_statements is preloaded", secs, r2WarmSecs, r2Producers, r2Accounts, r2DrainTimeout, r2Step, secs, steps)
	return nil
}

// openLoop runs insert at rate per second for secs seconds from
// r2Producers goroutines; it returns each event's commit time by id.
func openLoop(ctx context.Context, rate, secs int, insert func(ctx context.Context, k int) (string, error)) (map[string]time.Time, float64, time.Time, error) {
	n := rate * secs
	tickets := make(chan int, n)
	var (
		mu      sync.Mutex
		commits = make(map[string]time.Time, n)
		last    time.Time
		failed  atomic.Value
	)
	start := time.Now()
	go func() {
		defer close(tickets)
		for k := range n {
			if d := time.Until(start.Add(time.Duration(k) * time.Second / time.Duration(rate))); d > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(d):
				}
			}
			tickets <- k
		}
	}()
	var wg sync.WaitGroup
	for range r2Producers {
		wg.Go(func() {
			for k := range tickets {
				id, err := insert(ctx, k)
				at := time.Now()
				if err != nil {
					failed.CompareAndSwap(nil, err)
					continue
				}
				mu.Lock()
				commits[id] = at
				if at.After(last) {
					last = at
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		return nil, 0, last, err
	}
	return commits, float64(len(commits)) / last.Sub(start).Seconds(), last, ctx.Err()
}

// r2Measure waits for every committed event at the sink (at most 30 s) and
// turns arrivals into latencies.
func r2Measure(ctx context.Context, sink *probeSink, commits map[string]time.Time, achieved float64, last time.Time, rate int) r2Run {
	res := r2Run{target: float64(rate), achieved: achieved, backlogAtEnd: len(commits) - sink.distinct()}
	_ = waitFor(ctx, func() (bool, error) {
		return sink.distinct() >= len(commits) || time.Since(last) > r2DrainTimeout, nil
	})
	res.drain = time.Since(last)
	var latest time.Time
	for id, c := range commits {
		a, ok := sink.arrived(id)
		if !ok {
			res.lost++
			continue
		}
		res.lat = append(res.lat, ms(a.Sub(c)))
		if a.After(latest) {
			latest = a
		}
	}
	if !latest.IsZero() {
		res.drain = max(0, latest.Sub(last))
	}
	slices.Sort(res.lat)
	return res
}

// costs reads the database's counters: with start before the open loop,
// then after the drain with the events committed, returning their cost.
type r2Costs func(start bool, n int) (*r2Cost, error)

func r2Relay(ctx context.Context, e *workloadEnv, pool *pgxpool.Pool, rate, secs int, costs r2Costs) (r2Run, error) {
	if _, err := pool.Exec(ctx, `TRUNCATE outbox_event, outbox_aggregate`); err != nil {
		return r2Run{}, err
	}
	if e.o.r2Held {
		// Made before the run's events, so their ids are lower: the
		// relays' claims start their walk at or before them. Autovacuum
		// off: the run's 60,000 events would make a small table's
		// autovacuum clean the indexes every few seconds, which a large
		// table's never does.
		if _, err := pool.Exec(ctx, `ALTER TABLE outbox_event SET (autovacuum_enabled = false)`); err != nil {
			return r2Run{}, err
		}
		if _, err := pool.Exec(ctx, `
			INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, dead_at, dead_reason)
			VALUES ($1, 'r2-held', 'a', 1, 'payments', 'held.v1', '{}', 'dead', now(), 'bench: a dead letter waiting for an operator'),
			       ($2, 'r2-held', 'a', 2, 'payments', 'held.v1', '{}', 'pending', NULL, NULL)`,
			uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())); err != nil {
			return r2Run{}, fmt.Errorf("r2: the held event: %w", err)
		}
	}
	if err := settle(ctx, pool, "outbox_event"); err != nil {
		return r2Run{}, err
	}
	if e.o.r2Horizon {
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			return r2Run{}, err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		if _, err := tx.Exec(ctx, `SELECT 1`); err != nil { // the snapshot is taken here
			return r2Run{}, err
		}
	}
	prod, err := poolOf(ctx, pool, r2Producers+1)
	if err != nil {
		return r2Run{}, err
	}
	defer prod.Close()
	// With -r2-trace the relays get a pool of their own, and it and the
	// notifier's record their statements.
	var relayTrace, notifyTrace *stmtTrace
	notifyPool := prod
	if e.o.r2Trace != "" {
		relayTrace, notifyTrace = &stmtTrace{}, &stmtTrace{}
		if pool, err = tracedPool(ctx, pool, e.o.poolSize, relayTrace); err != nil {
			return r2Run{}, err
		}
		defer pool.Close()
		if notifyPool, err = tracedPool(ctx, prod, 1, notifyTrace); err != nil {
			return r2Run{}, err
		}
		defer notifyPool.Close()
	}
	sink := newProbeSink(nil)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	notifier := outbox.NewNotifier(notifyPool, 0, nil)
	wg.Go(func() { _ = notifier.Run(rctx) })
	var relays []*outbox.Relay
	for i := range e.o.relays {
		r, err := outbox.NewRelay(pool, sink, outbox.RelayConfig{Name: fmt.Sprintf("r2-%d", i), BatchSize: e.o.batch}, nil, nil)
		if err != nil {
			return r2Run{}, err
		}
		relays = append(relays, r)
		wg.Go(func() { _ = r.Run(rctx) })
	}
	time.Sleep(300 * time.Millisecond) // listeners up
	if err := r2WarmUp(ctx, sink, rate, r2Produce(prod, notifier)); err != nil {
		return r2Run{}, err
	}
	if relayTrace != nil {
		relayTrace.reset()
		notifyTrace.reset()
	}
	if _, err := costs(true, 0); err != nil {
		return r2Run{}, err
	}
	loopStart := time.Now()
	commits, achieved, last, err := openLoop(ctx, rate, secs, r2Produce(prod, notifier))
	if err != nil {
		return r2Run{}, err
	}
	res := r2Measure(ctx, sink, commits, achieved, last, rate)
	if relayTrace != nil {
		r2TraceRuns[rate]++
		file := fmt.Sprintf("%s-%d-%d.csv", e.o.r2Trace, rate, r2TraceRuns[rate])
		if err := writeR2Trace(file, loopStart, commits, sink, relayTrace, notifyTrace); err != nil {
			return r2Run{}, err
		}
		fmt.Printf("  trace: %s\n", file)
	}
	if res.lost > 0 {
		r2Diagnose(ctx, pool, relays)
	}
	prod.Close() // the producers' backends flush their statistics as they exit
	res.perEvent, err = costs(false, len(commits))
	return res, err
}

// r2Produce is R2's business transaction: one account row updated and one
// event inserted with outbox.Insert, then the relays poked.
func r2Produce(prod *pgxpool.Pool, notifier *outbox.Notifier) func(ctx context.Context, k int) (string, error) {
	return func(ctx context.Context, k int) (string, error) {
		var id string
		err := db.WithTx(ctx, prod, func(tx pgx.Tx) error {
			acct := k%r2Accounts + 1
			if _, err := tx.Exec(ctx, `UPDATE bench_account SET n = n + 1 WHERE id = $1`, acct); err != nil {
				return err
			}
			ins, err := outbox.Insert(ctx, tx, outbox.Event{AggregateType: "account", AggregateID: strconv.Itoa(acct),
				Topic: "payments", EventType: "account.changed.v1", Payload: payload})
			id = ins.ID.String()
			return err
		})
		if err == nil {
			notifier.Poke()
		}
		return id, err
	}
}

// r2Diagnose prints what the relays and their database are doing when
// events did not arrive: a stalled relay, not a slow one, is a bug to chase.
func r2Diagnose(ctx context.Context, pool *pgxpool.Pool, relays []*outbox.Relay) {
	for _, r := range relays {
		fmt.Printf("    diagnose: %s %+v\n", r.Config().Name, r.Stats())
	}
	var pending, leased, future int
	_ = pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE locked_until > now()),
		count(*) FILTER (WHERE available_at > now()) FROM outbox_event WHERE status = 'pending'`).Scan(&pending, &leased, &future)
	fmt.Printf("    diagnose: %d pending, %d under a live lease, %d not yet available\n", pending, leased, future)
	rows, err := pool.Query(ctx, `SELECT coalesce(state, ''), coalesce(wait_event_type, ''), coalesce(wait_event, ''),
		left(regexp_replace(query, '\s+', ' ', 'g'), 90) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	if err != nil {
		return
	}
	defer rows.Close()
	for rows.Next() {
		var st, wt, we, q string
		if rows.Scan(&st, &wt, &we, &q) == nil {
			fmt.Printf("    diagnose: backend %s %s/%s %s\n", st, wt, we, q)
		}
	}
}

func r2River(ctx context.Context, pool *pgxpool.Pool, rate, secs int, costs r2Costs) (r2Run, error) {
	if _, err := pool.Exec(ctx, `TRUNCATE river_job`); err != nil {
		return r2Run{}, err
	}
	// A checkpoint as before the relay's runs (settle), so both start
	// writing full-page images afresh; no ANALYZE: River's statistics stay
	// as they were before the WAL was recorded here.
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		return r2Run{}, err
	}
	prod, err := poolOf(ctx, pool, r2Producers+1)
	if err != nil {
		return r2Run{}, err
	}
	defer prod.Close()
	sink := newProbeSink(nil)
	var done atomic.Int64
	workers := river.NewWorkers()
	river.AddWorker(workers, &eventWorker{pub: sink, done: &done})
	rc := riverConfigs[0]
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Logger: slog.New(slog.DiscardHandler), Workers: workers,
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: rc.MaxWorkers}},
		FetchCooldown: rc.FetchCooldown, FetchPollInterval: rc.FetchPoll,
	})
	if err != nil {
		return r2Run{}, err
	}
	if err := client.Start(ctx); err != nil {
		return r2Run{}, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = client.Stop(sctx)
	}()
	inserter, err := river.NewClient(riverpgxv5.New(prod), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return r2Run{}, err
	}
	time.Sleep(300 * time.Millisecond)
	insert := func(ctx context.Context, k int) (string, error) {
		var id string
		err := db.WithTx(ctx, prod, func(tx pgx.Tx) error {
			acct := k%r2Accounts + 1
			if _, err := tx.Exec(ctx, `UPDATE bench_account SET n = n + 1 WHERE id = $1`, acct); err != nil {
				return err
			}
			res, err := inserter.InsertTx(ctx, tx, eventArgs{AggregateID: strconv.Itoa(acct), AggregateSeq: int64(k), Payload: payload}, nil)
			if err == nil {
				id = strconv.FormatInt(res.Job.ID, 10)
			}
			return err
		})
		return id, err
	}
	if err := r2WarmUp(ctx, sink, rate, insert); err != nil {
		return r2Run{}, err
	}
	if _, err := costs(true, 0); err != nil {
		return r2Run{}, err
	}
	commits, achieved, last, err := openLoop(ctx, rate, secs, insert)
	if err != nil {
		return r2Run{}, err
	}
	res := r2Measure(ctx, sink, commits, achieved, last, rate)
	prod.Close() // the producers' backends flush their statistics as they exit
	res.perEvent, err = costs(false, len(commits))
	return res, err
}
