package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/sluice-dev/sluice/internal/broker"
)

// riverConfig is one stated River configuration; the table reports the
// best of them per sink.
type riverConfig struct {
	Name          string
	MaxWorkers    int
	FetchCooldown time.Duration
	FetchPoll     time.Duration
}

var riverConfigs = []riverConfig{
	{"w1000-cool20ms-poll50ms", 1000, 20 * time.Millisecond, 50 * time.Millisecond}, // issue 12's best
	{"w100-cool20ms-poll50ms", 100, 20 * time.Millisecond, 50 * time.Millisecond},
	{"w1000-default", 1000, 0, 0}, // River's defaults: cooldown 100ms, poll 1s
}

// eventArgs is one outbox-like event as a River job.
type eventArgs struct {
	AggregateID  string          `json:"aggregate_id"`
	AggregateSeq int64           `json:"aggregate_seq"`
	Payload      json.RawMessage `json:"payload"`
}

func (eventArgs) Kind() string { return "bench_event" }

type eventWorker struct {
	river.WorkerDefaults[eventArgs]
	pub  broker.Publisher
	done *atomic.Int64
}

func (w *eventWorker) Work(ctx context.Context, job *river.Job[eventArgs]) error {
	if err := w.pub.Publish(ctx, broker.Message{
		ID: strconv.FormatInt(job.ID, 10), Topic: "payments",
		AggregateType: "payment", AggregateID: job.Args.AggregateID, AggregateSeq: job.Args.AggregateSeq,
		EventType: "payment.requested.v1", Payload: job.Args.Payload,
	}); err != nil {
		return err
	}
	w.done.Add(1)
	return nil
}

func migrateRiver(ctx context.Context, pool *pgxpool.Pool) error {
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	return err
}

func preloadRiver(ctx context.Context, pool *pgxpool.Pool, rows int) error {
	if _, err := pool.Exec(ctx, `TRUNCATE river_job`); err != nil {
		return err
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	a := aggregates(rows)
	const chunk = 5000
	for lo := 0; lo < rows; lo += chunk {
		params := make([]river.InsertManyParams, 0, chunk)
		for i := lo; i < min(rows, lo+chunk); i++ {
			params = append(params, river.InsertManyParams{Args: eventArgs{
				AggregateID: fmt.Sprintf("pay-%07d", i%a), AggregateSeq: int64(i/a + 1), Payload: payload,
			}})
		}
		if _, err := client.InsertManyFast(ctx, params); err != nil {
			return fmt.Errorf("river insert: %w", err)
		}
	}
	return settle(ctx, pool, "river_job")
}

// runRiver works every preloaded job; the clock stops once the client has
// stopped, i.e. after River recorded the last completions.
func runRiver(ctx context.Context, pool *pgxpool.Pool, pub broker.Publisher, rows int, rc riverConfig) (time.Duration, error) {
	var done atomic.Int64
	workers := river.NewWorkers()
	river.AddWorker(workers, &eventWorker{pub: pub, done: &done})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Logger:            slog.New(slog.DiscardHandler),
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: rc.MaxWorkers}},
		Workers:           workers,
		FetchCooldown:     rc.FetchCooldown,
		FetchPollInterval: rc.FetchPoll,
	})
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return 0, err
	}
	werr := waitFor(ctx, func() (bool, error) { return done.Load() >= int64(rows), nil })
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	serr := client.Stop(sctx)
	el := time.Since(start)
	if werr != nil {
		return el, werr
	}
	if serr != nil {
		return el, serr
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE state <> 'completed'`).Scan(&left); err != nil {
		return el, err
	}
	if left != 0 {
		return el, fmt.Errorf("river: %d jobs not completed after stop", left)
	}
	return el, nil
}
