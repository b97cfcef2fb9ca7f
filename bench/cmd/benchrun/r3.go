package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// R3 ordered: events of 1,000 aggregates, skewed (80% of the events on 20%
// of the aggregates), drained by the relay with ordering on. Baselines in the
// same run: the same relay with ordering off (BENCH.md: "R1 without
// ordering") and River (its best R1 configuration), which has no
// per-aggregate order at all: its inversions are what a consumer would have
// to absorb. The sink counts inversions (an event arriving after a later
// event of its aggregate): the relay with ordering on must have 0.

func init() { register(30, "r3", runR3) }

const r3Aggregates = 1000

// r3Aggregate is event i's aggregate: 80% of the events go to the first
// 20% of the aggregates (a fixed seed, so every system sees the same data).
func r3Plan(rows int) []int {
	rnd := rand.New(rand.NewPCG(3, 3))
	out := make([]int, rows)
	hot := r3Aggregates / 5
	for i := range out {
		if rnd.Float64() < 0.8 {
			out[i] = rnd.IntN(hot)
		} else {
			out[i] = hot + rnd.IntN(r3Aggregates-hot)
		}
	}
	return out
}

func preloadSkewed(ctx context.Context, pool *pgxpool.Pool, plan []int, headers func(i int) []byte) error {
	if _, err := pool.Exec(ctx, `TRUNCATE outbox_event, outbox_aggregate`); err != nil {
		return err
	}
	seq := map[int]int64{}
	src := make([][]any, 0, len(plan))
	for i, a := range plan {
		id, err := uuid.NewV7()
		if err != nil {
			return err
		}
		seq[a]++
		h := []byte(`{}`)
		if headers != nil {
			h = headers(i)
		}
		src = append(src, []any{id, "payment", fmt.Sprintf("pay-%07d", a), seq[a], "payments", "payment.requested.v1", []byte(payload), h})
	}
	if err := copyOutbox(ctx, pool, src); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO outbox_aggregate (aggregate_type, aggregate_id, last_seq)
		SELECT aggregate_type, aggregate_id, max(aggregate_seq) FROM outbox_event GROUP BY 1, 2`); err != nil {
		return err
	}
	return settle(ctx, pool, "outbox_event", "outbox_aggregate")
}

func preloadRiverPlan(ctx context.Context, pool *pgxpool.Pool, plan []int) error {
	if _, err := pool.Exec(ctx, `TRUNCATE river_job`); err != nil {
		return err
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	seq := map[int]int64{}
	const chunk = 5000
	for lo := 0; lo < len(plan); lo += chunk {
		params := make([]river.InsertManyParams, 0, chunk)
		for _, a := range plan[lo:min(len(plan), lo+chunk)] {
			seq[a]++
			params = append(params, river.InsertManyParams{Args: eventArgs{AggregateID: fmt.Sprintf("pay-%07d", a), AggregateSeq: seq[a], Payload: payload}})
		}
		if _, err := client.InsertManyFast(ctx, params); err != nil {
			return err
		}
	}
	return settle(ctx, pool, "river_job")
}

func runR3(ctx context.Context, e *workloadEnv) error {
	rows := e.size(e.o.rows, 10000)
	plan := r3Plan(rows)
	spool, err := e.newDB("r3")
	if err != nil {
		return err
	}
	defer spool.Close()
	if err := migrateSluice(ctx, spool); err != nil {
		return err
	}
	rpool, err := e.newDB("r3river")
	if err != nil {
		return err
	}
	defer rpool.Close()
	if err := migrateRiver(ctx, rpool); err != nil {
		return err
	}
	type sys struct {
		name, config string
		run          func(*probeSink) (time.Duration, error)
	}
	systems := []sys{
		{"relay", fmt.Sprintf("%d relays, batch %d, ordered", e.o.relays, e.o.batch), func(s *probeSink) (time.Duration, error) {
			if err := preloadSkewed(ctx, spool, plan, nil); err != nil {
				return 0, err
			}
			return runRelay(ctx, spool, s, rows, e.o.relays, e.o.batch, true)
		}},
		{"relay", fmt.Sprintf("%d relays, batch %d, ordering off", e.o.relays, e.o.batch), func(s *probeSink) (time.Duration, error) {
			if err := preloadSkewed(ctx, spool, plan, nil); err != nil {
				return 0, err
			}
			return runRelay(ctx, spool, s, rows, e.o.relays, e.o.batch, false)
		}},
		{"river", riverConfigs[0].Name + " (no order)", func(s *probeSink) (time.Duration, error) {
			if err := preloadRiverPlan(ctx, rpool, plan); err != nil {
				return 0, err
			}
			return runRiver(ctx, rpool, s, rows, riverConfigs[0])
		}},
	}
	res := make([]*wlResult, len(systems))
	inv := make([]*wlResult, len(systems))
	for r := 0; r < e.o.runs; r++ {
		for i, s := range systems {
			sink := newProbeSink(nil)
			el, err := s.run(sink)
			if err != nil {
				return fmt.Errorf("%s %s: %w", s.name, s.config, err)
			}
			n, dups, inversions := sink.counts()
			if n != rows {
				return fmt.Errorf("%s %s: %d distinct events at the sink, want %d", s.name, s.config, n, rows)
			}
			if res[i] == nil {
				res[i] = &wlResult{Workload: "R3", Metric: fmt.Sprintf("%d events, %d aggregates skewed 80/20: events/s", rows, r3Aggregates), System: s.name, Config: s.config, Unit: "ev/s"}
				inv[i] = &wlResult{Workload: "R3", Metric: "order inversions at the sink", System: s.name, Config: s.config, Unit: "events",
					Details: map[string]any{}}
			}
			res[i].Runs = append(res[i].Runs, float64(rows)/el.Seconds())
			inv[i].Runs = append(inv[i].Runs, float64(inversions))
			inv[i].Details[fmt.Sprintf("run%d_duplicates", r+1)] = dups
			fmt.Printf("  run %d %-5s %-32s %6.0f ev/s, inversions %d, duplicates %d\n", r+1, s.name, s.config, float64(rows)/el.Seconds(), inversions, dups)
		}
	}
	for _, r := range []*wlResult{res[1], res[2], inv[1], inv[2]} {
		e.add(r)
	}
	e.add(res[0]).against(res[1].settle())
	e.add(inv[0]).goal("0 inversions", inv[0].settle().Max == 0)
	ratioRiver := &wlResult{Workload: "R3", Metric: "ordered relay events/s ÷ River (no order)", System: "relay", Config: res[0].Config,
		Unit: "ev/s", Runs: res[0].Runs}
	e.add(ratioRiver).against(res[2].settle())
	e.note("r3", "%d events, 1 KB payload, %d aggregates (80%% of the events on the first %d); the ordered relay's ratio is over the same relay with ordering off (BENCH.md's baseline) and over River, which keeps no order (its inversions are listed)", rows, r3Aggregates, r3Aggregates/5)
	return nil
}
