package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

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

var r2Rates = []int{500, 1000, 2000}

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
}

func (r r2Run) sustainable() bool {
	return r.achieved >= 0.95*r.target && r.lost == 0 && r.drain <= 2*time.Second && pct(r.lat, 99) <= 1000
}

func runR2(ctx context.Context, e *workloadEnv) error {
	secs := e.size(60, 5)
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
	runs := map[string][]r2Run{}
	for r := 0; r < e.o.runs; r++ {
		for _, rate := range r2Rates {
			for _, sys := range []string{"relay", "river"} {
				var res r2Run
				if sys == "relay" {
					res, err = r2Relay(ctx, e, spool, rate, secs)
				} else {
					res, err = r2River(ctx, rpool, rate, secs)
				}
				if err != nil {
					return fmt.Errorf("%s at %d/s: %w", sys, rate, err)
				}
				key := sys + strconv.Itoa(rate)
				runs[key] = append(runs[key], res)
				fmt.Printf("  run %d %-5s %5d ev/s target, %6.0f achieved: p50 %6.1f ms p99 %7.1f ms p99.9 %7.1f ms, drain %v, not arrived %d, sustainable %v\n",
					r+1, sys, rate, res.achieved, pct(res.lat, 50), pct(res.lat, 99), pct(res.lat, 99.9), res.drain.Round(time.Millisecond), res.lost, res.sustainable())
			}
		}
	}
	highest := map[string]int{}
	for _, rate := range r2Rates {
		var base99 *wlResult
		for _, sys := range []string{"river", "relay"} {
			rs := runs[sys+strconv.Itoa(rate)]
			p50, p99, p999, ach := &wlResult{}, &wlResult{}, &wlResult{}, 0.0
			sustainable := true
			var backlog, notArrived, drainMS []float64
			for _, r := range rs {
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
				"backlog_at_last_commit": backlog, "not_arrived": notArrived, "drain_after_last_commit_ms": drainMS}
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
	hi := &wlResult{Workload: "R2", Metric: "highest sustainable rate of " + fmt.Sprint(r2Rates), System: "relay",
		Unit: "ev/s", Runs: []float64{float64(highest["relay"])}}
	hriver := &wlResult{Workload: "R2", Metric: hi.Metric, System: "river", Config: riverConfigs[0].Name, Unit: "ev/s", Runs: []float64{float64(highest["river"])}}
	e.add(hriver)
	e.add(hi).against(hriver.settle())
	e.note("r2", "%d s per rate, %d producers (own pool), 1 KB payload, %d accounts; latency = first arrival at an in-process sink − the producer's commit return; sustainable = ≥95%% of the rate achieved, nothing lost, drained ≤ 2 s after the last commit, p99 ≤ 1 s; events not at the sink %v after the last commit count as lost", secs, r2Producers, r2Accounts, r2DrainTimeout)
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

func r2Relay(ctx context.Context, e *workloadEnv, pool *pgxpool.Pool, rate, secs int) (r2Run, error) {
	if _, err := pool.Exec(ctx, `TRUNCATE outbox_event, outbox_aggregate`); err != nil {
		return r2Run{}, err
	}
	if err := settle(ctx, pool, "outbox_event"); err != nil {
		return r2Run{}, err
	}
	prod, err := poolOf(ctx, pool, r2Producers+1)
	if err != nil {
		return r2Run{}, err
	}
	defer prod.Close()
	sink := newProbeSink(nil)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	notifier := outbox.NewNotifier(prod, 0, nil)
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
	commits, achieved, last, err := openLoop(ctx, rate, secs, r2Produce(prod, notifier))
	if err != nil {
		return r2Run{}, err
	}
	res := r2Measure(ctx, sink, commits, achieved, last, rate)
	if res.lost > 0 {
		r2Diagnose(ctx, pool, relays)
	}
	return res, nil
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

func r2River(ctx context.Context, pool *pgxpool.Pool, rate, secs int) (r2Run, error) {
	if _, err := pool.Exec(ctx, `TRUNCATE river_job`); err != nil {
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
	commits, achieved, last, err := openLoop(ctx, rate, secs, func(ctx context.Context, k int) (string, error) {
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
	})
	if err != nil {
		return r2Run{}, err
	}
	return r2Measure(ctx, sink, commits, achieved, last, rate), nil
}
