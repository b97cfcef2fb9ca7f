package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/natsbroker"
	"github.com/sluice-dev/sluice/internal/broker/natsembedded"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// R4's outage phase (BENCH.md: "plus a 30 s broker outage"): the poison
// preload drained into a real broker, embedded NATS JetStream through the
// product's adapter (natsbroker), which the bench shuts down part-way and
// starts again on the same port and store after the outage. The relays see
// what they would see in production: publishes hang, then fail while the
// adapter is disconnected (it wraps them in broker.ErrUnavailable, which the
// relay treats as "not an attempt"), and the client reconnects on its own
// (natsbroker: every 500 ms, plus nats.go's jitter of up to 100 ms).

// r4Broker is that broker plus the probe: what JetStream acknowledged is
// recorded as arrived; a poison event the broker acknowledged is then
// refused (the sink's verdict on the event), so while the broker is down a
// poison event fails like every other event, with the adapter's error.
type r4Broker struct {
	probe       *probeSink
	dir         string
	port        int
	srv         *natsembedded.Server
	js          *natsbroker.JetStream
	unavailable atomic.Int64 // publishes failed with broker.ErrUnavailable
	other       atomic.Int64 // failed otherwise (each one spends an attempt)
	otherErr    atomic.Value // the first such error, for the report
}

func startR4Broker(ctx context.Context) (*r4Broker, error) {
	dir, err := os.MkdirTemp("", "sluice-bench-r4-nats-")
	if err != nil {
		return nil, err
	}
	srv, err := natsembedded.StartAt(dir, -1)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	js, err := natsbroker.Open(ctx, srv.ClientURL(), broker.Options{Namespace: "bench-r4"})
	if err != nil {
		srv.Shutdown()
		os.RemoveAll(dir)
		return nil, err
	}
	return &r4Broker{probe: newProbeSink(nil), dir: dir, port: srv.Port(), srv: srv, js: js}, nil
}

func (b *r4Broker) PublishBatch(ctx context.Context, msgs []broker.Message) []error {
	errs := b.js.PublishBatch(ctx, msgs)
	now := time.Now()
	for i, m := range msgs {
		switch {
		case errs[i] == nil && m.Headers[poisonHeader] == "1":
			b.probe.refused.Add(1)
			errs[i] = errPoison
		case errs[i] == nil:
			b.probe.record(m, now)
		case errors.Is(errs[i], broker.ErrUnavailable):
			b.unavailable.Add(1)
		default:
			b.other.Add(1)
			b.otherErr.CompareAndSwap(nil, errs[i].Error())
		}
	}
	return errs
}

func (b *r4Broker) Publish(ctx context.Context, m broker.Message) error {
	return b.PublishBatch(ctx, []broker.Message{m})[0]
}

// outage shuts the server down for d and starts it again on the same port
// and folder (its stream comes back from the store); it returns when the
// server is ready again.
func (b *r4Broker) outage(ctx context.Context, d time.Duration) error {
	b.srv.Shutdown()
	b.srv = nil
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
	}
	srv, err := natsembedded.StartAt(b.dir, b.port)
	if err != nil {
		return fmt.Errorf("restart the broker: %w", err)
	}
	b.srv = srv
	return nil
}

func (b *r4Broker) close() {
	_ = b.js.Close()
	if b.srv != nil {
		b.srv.Shutdown()
	}
	os.RemoveAll(b.dir)
}

type r4OutageResult struct {
	before, after       float64       // healthy events/s before the outage, after the broker's return
	resume              time.Duration // broker ready again → first acknowledged publish
	drained             time.Duration // broker ready again → every healthy event arrived and every poison event dead
	backlogAtDown       int           // healthy events not arrived when the broker went down
	backlogAtBack       int           // … when it was back
	poisonAlive         int           // poison events not yet dead when the broker went down
	unavailable, other  int64
	arrived             int
	dups, inversions    int64
	refused             int64
	deadHealthy         int // dead events that are not poison (must be 0)
	deadWrongAttempts   int // dead events whose attempts ≠ r4MaxAttempts (must be 0)
	dead                int
	publishedRetried    int // published events with attempts ≠ 1: an attempt spent by the outage
	pending             int
	stats               []outbox.RelayStats
	otherErr            string
	healthy, poison     int
	held                int
	outageLen, sinceRun time.Duration
}

func (r r4OutageResult) correct() bool {
	return r.arrived == r.healthy && r.inversions == 0 && r.deadHealthy == 0 && r.deadWrongAttempts == 0 &&
		r.dead == r.poison && r.refused == int64(r.poison*r4MaxAttempts) && r.publishedRetried == 0 &&
		r.pending == r.held && r.unavailable > 0
}

// r4Outage drains the poison preload into JetStream with a broker outage
// of length d. The broker goes down once the sink has refused as many
// publishes as there are poison events: the poison events are then part-way
// through their attempts, so the outage meets events whose attempts count,
// and most of the healthy events are still waiting.
func r4Outage(ctx context.Context, pool *pgxpool.Pool, e *workloadEnv, plan []int, headers func(int) []byte,
	healthy, poison, held int, d time.Duration) (res r4OutageResult, err error) {
	res.healthy, res.poison, res.held, res.outageLen = healthy, poison, held, d
	if err := preloadSkewed(ctx, pool, plan, headers); err != nil {
		return res, err
	}
	b, err := startR4Broker(ctx)
	if err != nil {
		return res, err
	}
	defer b.close()
	rs, err := r4Relays(pool, b, e)
	if err != nil {
		return res, err
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stopped := false
	stop := func() {
		if !stopped {
			cancel()
			wg.Wait()
			stopped = true
		}
	}
	defer stop()
	start := time.Now()
	for _, r := range rs {
		wg.Go(func() { _ = r.Run(rctx) })
	}
	tctx, tcancel := context.WithTimeout(ctx, 5*time.Minute+d)
	defer tcancel()
	if err := waitFor(tctx, func() (bool, error) {
		return b.probe.refused.Load() >= int64(poison) || b.probe.distinct() >= healthy, nil
	}); err != nil {
		return res, fmt.Errorf("before the outage: %d refusals: %w", b.probe.refused.Load(), err)
	}
	down := time.Now()
	before := b.probe.distinct()
	var deadAtDown int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE status = 'dead'`).Scan(&deadAtDown); err != nil {
		return res, err
	}
	res.backlogAtDown, res.poisonAlive = healthy-before, poison-deadAtDown
	res.before = float64(before) / down.Sub(start).Seconds()
	if err := b.outage(tctx, d); err != nil {
		return res, err
	}
	back := time.Now()
	atBack := b.probe.distinct()
	res.backlogAtBack = healthy - atBack
	if err := waitFor(tctx, func() (bool, error) {
		if b.probe.distinct() < healthy {
			return false, nil
		}
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE status = 'dead'`).Scan(&n)
		return n >= poison, err
	}); err != nil {
		return res, fmt.Errorf("after the outage: %d of %d healthy events: %w", b.probe.distinct(), healthy, err)
	}
	res.drained = time.Since(back)
	res.sinceRun = time.Since(start)
	stop()
	for _, r := range rs {
		res.stats = append(res.stats, r.Stats())
	}
	first, last := b.probe.firstAfter(back)
	if !first.IsZero() {
		res.resume = first.Sub(back)
		if span := last.Sub(first).Seconds(); span > 0 {
			res.after = float64(healthy-atBack) / span
		}
	}
	res.arrived, res.dups, res.inversions = b.probe.counts()
	res.refused = b.probe.refused.Load()
	res.unavailable, res.other = b.unavailable.Load(), b.other.Load()
	if s, ok := b.otherErr.Load().(string); ok {
		res.otherErr = s
	}
	err = pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'dead' AND headers->>$1 IS NULL),
		count(*) FILTER (WHERE status = 'dead' AND attempts <> $2),
		count(*) FILTER (WHERE status = 'dead'),
		count(*) FILTER (WHERE status = 'published' AND attempts <> 1),
		count(*) FILTER (WHERE status = 'pending')
		FROM outbox_event`, poisonHeader, r4MaxAttempts).Scan(&res.deadHealthy, &res.deadWrongAttempts, &res.dead, &res.publishedRetried, &res.pending)
	return res, err
}
