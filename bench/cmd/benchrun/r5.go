package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/outbox"
)

// R5 crash: two relays, each a real process (bench/cmd/relayproc, whose
// broker is its stdout). BENCH.md's run: R2's open loop at 1,000 events/s
// while one of them is killed with SIGKILL every 20 s (10 s quick) and
// started again at once; the sink (this process, reading both pipes) checks
// that every committed event arrived and is marked published, counts
// duplicates and measures commit→sink latency around the kills. A second
// run kills a relay three times during a burn-down of a preload, when it
// holds full batches. A killed relay's claims come back when their lease
// (2 s here) expires.

func init() {
	register(50, "r5", runR5)
	flag.StringVar(&relayprocBin, "relayproc", "", "R5: relayproc binary (default: go build ./cmd/relayproc into a temporary directory)")
}

var relayprocBin string

const r5Lease = 2 * time.Second

type r5Sink struct {
	mu    sync.Mutex
	seen  map[string]int
	at    map[string]time.Time // id → first read
	total int
	first map[int]time.Time // process generation → first line
}

func (s *r5Sink) read(gen int, f *os.File) {
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		now := time.Now()
		s.mu.Lock()
		id := sc.Text()
		if s.seen[id] == 0 {
			s.at[id] = now
		}
		s.seen[id]++
		s.total++
		if _, ok := s.first[gen]; !ok {
			s.first[gen] = now
		}
		s.mu.Unlock()
	}
}

func (s *r5Sink) distinct() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

func runR5(ctx context.Context, e *workloadEnv) error {
	bin := relayprocBin
	if bin == "" {
		dir, err := os.MkdirTemp("", "sluice-bench-relayproc-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		bin = filepath.Join(dir, "relayproc")
		if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/relayproc").CombinedOutput(); err != nil {
			return fmt.Errorf("build relayproc (run from bench/): %w: %s", err, out)
		}
	}
	pool, err := e.newDB("r5")
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrateSluice(ctx, pool); err != nil {
		return err
	}
	if err := r5OpenLoopRows(ctx, e, pool, bin); err != nil {
		return err
	}
	return r5BurnDownRows(ctx, e, pool, bin)
}

// r5OpenLoopRows is BENCH.md's R5: R2's open loop at 1,000 events/s while
// process 0 of the two relay processes is killed every 20 s (10 s quick).
func r5OpenLoopRows(ctx context.Context, e *workloadEnv, pool *pgxpool.Pool, bin string) error {
	const rate = 1000
	secs := e.size(60, 30)
	every := time.Duration(e.size(20, 10)) * time.Second
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_account (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
		INSERT INTO bench_account (id) SELECT generate_series(1, 1000) ON CONFLICT DO NOTHING`); err != nil {
		return err
	}
	kills := (secs - 1) / int(every/time.Second)
	cfg := fmt.Sprintf("2 relay processes, open loop %d/s for %d s, process 0 killed every %v", rate, secs, every)
	lost := &wlResult{Workload: "R5", Metric: fmt.Sprintf("open loop: events lost (%d SIGKILLs)", kills), System: "relay", Config: cfg, Unit: "events"}
	dups := &wlResult{Workload: "R5", Metric: "open loop: duplicates at the sink", System: "relay", Config: cfg, Unit: "events", Details: map[string]any{}}
	resume := &wlResult{Workload: "R5", Metric: "open loop: kill → restarted process's first publish", System: "relay", Config: cfg, Unit: "s"}
	quiet := &wlResult{Workload: "R5", Metric: "open loop: p99 commit→sink away from kills", System: "relay", Config: cfg, Unit: "ms", Details: map[string]any{}}
	near := &wlResult{Workload: "R5", Metric: "open loop: p99 across a kill or ≤ 2 s after", System: "relay", Config: cfg, Unit: "ms", Details: map[string]any{}}
	slowest := &wlResult{Workload: "R5", Metric: "open loop: slowest event across a kill or ≤ 2 s after", System: "relay", Config: cfg, Unit: "ms"}
	ok := true
	for r := 0; r < e.o.runs; r++ {
		res, err := r5OpenLoop(ctx, pool, bin, e.o.batch, rate, secs, every)
		if err != nil {
			return err
		}
		fmt.Printf("  run %d open loop: %d committed (%.0f/s), %d lost, %d duplicates, %d claimed twice, %d not marked published, resume %v; p50/p99 away from kills %.1f/%.1f ms (%d events), across a kill or ≤ 2 s after %.1f/%.1f ms (%d events), max %.0f ms\n",
			r+1, res.committed, res.achieved, res.lost, res.dups, res.reclaimed, res.unpublished, res.resume,
			pct(res.quiet, 50), pct(res.quiet, 99), len(res.quiet), pct(res.near, 50), pct(res.near, 99), len(res.near), pct(res.near, 100))
		ok = ok && res.lost == 0 && res.unpublished == 0
		lost.Runs = append(lost.Runs, float64(res.lost))
		dups.Runs = append(dups.Runs, float64(res.dups))
		dups.Details[fmt.Sprintf("run%d_claimed_twice", r+1)] = res.reclaimed
		dups.Details[fmt.Sprintf("run%d_committed", r+1)] = res.committed
		dups.Details[fmt.Sprintf("run%d_achieved_rate", r+1)] = res.achieved
		for _, d := range res.resume {
			resume.Runs = append(resume.Runs, d.Seconds())
		}
		quiet.Runs = append(quiet.Runs, pct(res.quiet, 99))
		quiet.Details[fmt.Sprintf("run%d_p50_ms", r+1)] = pct(res.quiet, 50)
		near.Runs = append(near.Runs, pct(res.near, 99))
		near.Details[fmt.Sprintf("run%d_p50_ms", r+1)] = pct(res.near, 50)
		slowest.Runs = append(slowest.Runs, pct(res.near, 100))
		near.Details[fmt.Sprintf("run%d_events", r+1)] = len(res.near)
	}
	e.add(lost).goal("0 lost, all marked published", ok)
	e.add(dups)
	e.add(resume)
	e.add(quiet)
	e.add(near).against(quiet)
	e.add(slowest)
	e.note("r5", "open loop: R2's producers and transaction (16 producers, 1 account row + 1 event, Notifier.Poke) at %d/s for %d s; 2 relayproc processes (batch %d, lease %v, LISTEN on, poll 50 ms); process 0 gets SIGKILL every %v and is started again at once; lost = committed ids never written to a pipe (the run waits up to %v + the lease after the last commit); latency = the bench's read of the id from a pipe − the producer's commit; \"across a kill or ≤ 2 s after\" = events committed before a kill and arriving after it, or committed in the 2 s after it (the killed process's claims come back after the lease, so its held events take about the lease: see the slowest; how many there were is claimed_twice in details)", rate, secs, e.o.batch, r5Lease, every, r2DrainTimeout)
	return nil
}

// r5BurnDownRows kills a relay while both run flat out on a preload: full
// batches and a claim ahead, so the killed process holds the most it ever
// does (the open loop's relays mostly hold a few events).
func r5BurnDownRows(ctx context.Context, e *workloadEnv, pool *pgxpool.Pool, bin string) error {
	rows := e.size(e.o.rows, 20000)
	dups := &wlResult{Workload: "R5", Metric: "burn-down: duplicates at the sink (3 SIGKILLs)", System: "relay", Config: "2 relay processes, one killed 3×", Unit: "events"}
	lost := &wlResult{Workload: "R5", Metric: "burn-down: events lost", System: "relay", Config: dups.Config, Unit: "events"}
	resume := &wlResult{Workload: "R5", Metric: "burn-down: kill → restarted process's first publish", System: "relay", Config: dups.Config, Unit: "s"}
	elapsed := &wlResult{Workload: "R5", Metric: fmt.Sprintf("burn-down: drain of %d events with the kills", rows), System: "relay", Config: dups.Config, Unit: "ev/s"}
	ok := true
	for r := 0; r < e.o.runs; r++ {
		if err := preloadOutbox(ctx, pool, rows); err != nil {
			return err
		}
		res, err := r5Once(ctx, pool, bin, rows, e.o.batch)
		if err != nil {
			return err
		}
		var published int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE status = 'published'`).Scan(&published); err != nil {
			return err
		}
		// Claimed more than once: a killed relay's claims taken over after
		// their lease (duplicates only where it had already published them).
		var reclaimed int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE attempts > 1`).Scan(&reclaimed); err != nil {
			return err
		}
		ok = ok && res.lost == 0 && published == rows
		fmt.Printf("  run %d burn-down: %d events, %d distinct at the sink, %d duplicates, %d lost, %d marked published, %d claimed twice, resume %v, %.2fs\n",
			r+1, rows, rows-res.lost, res.dups, res.lost, published, reclaimed, res.resume, res.el.Seconds())
		if dups.Details == nil {
			dups.Details = map[string]any{}
		}
		dups.Details[fmt.Sprintf("run%d_claimed_twice", r+1)] = reclaimed
		dups.Runs = append(dups.Runs, float64(res.dups))
		lost.Runs = append(lost.Runs, float64(res.lost))
		for _, d := range res.resume {
			resume.Runs = append(resume.Runs, d.Seconds())
		}
		elapsed.Runs = append(elapsed.Runs, float64(rows)/res.el.Seconds())
	}
	e.add(elapsed)
	e.add(dups)
	e.add(lost).goal("0 lost, all marked", ok)
	e.add(resume)
	e.note("r5", "burn-down: %d preloaded events (R1's shape), the same 2 relayproc processes; process 0 gets SIGKILL when the sink has a quarter, half and three quarters of the events, and is started again at once; the sink is the processes' stdout (one write per event before its mark), read by the bench; a run is done when every event arrived and none is pending; kept beside the open loop because its relays run full batches with a claim ahead, so a killed process holds the most it can (duplicates, claims taken over after the lease), which the open loop's small batches rarely show", rows)
	return nil
}

// r5Procs runs relayproc processes whose stdout the sink reads.
type r5Procs struct {
	pool    *pgxpool.Pool
	bin     string
	batch   int
	sink    *r5Sink
	readers sync.WaitGroup
	procs   []*exec.Cmd
	gen     int
}

func newR5Procs(pool *pgxpool.Pool, bin string, batch int) *r5Procs {
	return &r5Procs{pool: pool, bin: bin, batch: batch,
		sink: &r5Sink{seen: map[string]int{}, at: map[string]time.Time{}, first: map[int]time.Time{}}}
}

// start starts process i (again); it returns the new process's generation.
func (p *r5Procs) start(i int) (int, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(p.bin, "-db", p.pool.Config().ConnString(), "-name", fmt.Sprintf("relayproc-%d-%d", i, p.gen),
		"-batch", fmt.Sprint(p.batch), "-lease", r5Lease.String())
	cmd.Stdout, cmd.Stderr = pw, os.Stderr
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return 0, err
	}
	pw.Close()
	g := p.gen
	p.gen++
	p.readers.Go(func() { p.sink.read(g, pr); pr.Close() })
	for len(p.procs) <= i {
		p.procs = append(p.procs, nil)
	}
	p.procs[i] = cmd
	return g, nil
}

// kill kills process i with SIGKILL and starts it again at once; it returns
// the time of the kill and the new process's generation.
func (p *r5Procs) kill(i int) (time.Time, int, error) {
	_ = p.procs[i].Process.Signal(syscall.SIGKILL)
	_ = p.procs[i].Wait()
	at := time.Now()
	g, err := p.start(i)
	return at, g, err
}

func (p *r5Procs) stopAll() {
	for _, c := range p.procs {
		if c != nil && c.ProcessState == nil {
			_ = c.Process.Signal(syscall.SIGTERM)
			_ = c.Wait()
		}
	}
	p.readers.Wait()
}

// resumes is, for each kill, the time until the restarted process's first
// publish.
func (p *r5Procs) resumes(killedAt []time.Time, gens []int) []time.Duration {
	p.sink.mu.Lock()
	defer p.sink.mu.Unlock()
	var out []time.Duration
	for i, k := range killedAt {
		if f, ok := p.sink.first[gens[i]]; ok {
			out = append(out, f.Sub(k).Round(time.Millisecond))
		}
	}
	slices.Sort(out)
	return out
}

type r5LoopResult struct {
	committed, lost, dups, reclaimed, unpublished int
	achieved                                      float64
	resume                                        []time.Duration
	quiet, near                                   []float64 // ms, sorted: away from kills; across a kill or committed ≤ 2 s after one
}

func r5OpenLoop(ctx context.Context, pool *pgxpool.Pool, bin string, batch, rate, secs int, every time.Duration) (r5LoopResult, error) {
	var res r5LoopResult
	if _, err := pool.Exec(ctx, `TRUNCATE outbox_event, outbox_aggregate`); err != nil {
		return res, err
	}
	if err := settle(ctx, pool, "outbox_event"); err != nil {
		return res, err
	}
	prod, err := poolOf(ctx, pool, r2Producers+1)
	if err != nil {
		return res, err
	}
	defer prod.Close()
	nctx, ncancel := context.WithCancel(ctx)
	var nwg sync.WaitGroup
	defer nwg.Wait()
	defer ncancel()
	notifier := outbox.NewNotifier(prod, 0, nil)
	nwg.Go(func() { _ = notifier.Run(nctx) })
	p := newR5Procs(pool, bin, batch)
	defer p.stopAll()
	for i := range 2 {
		if _, err := p.start(i); err != nil {
			return res, err
		}
	}
	time.Sleep(500 * time.Millisecond) // listeners up
	var (
		killedAt []time.Time
		gens     []int
		killErr  error
		kwg      sync.WaitGroup
	)
	kctx, kcancel := context.WithCancel(ctx)
	start := time.Now()
	kwg.Go(func() {
		for k := 1; time.Duration(k)*every < time.Duration(secs)*time.Second; k++ {
			select {
			case <-kctx.Done():
				return
			case <-time.After(time.Until(start.Add(time.Duration(k) * every))):
			}
			at, g, err := p.kill(0)
			if err != nil {
				killErr = err
				return
			}
			killedAt, gens = append(killedAt, at), append(gens, g)
		}
	})
	commits, achieved, _, err := openLoop(ctx, rate, secs, r2Produce(prod, notifier))
	kcancel()
	kwg.Wait()
	if err != nil {
		return res, err
	}
	if killErr != nil {
		return res, fmt.Errorf("restart after a kill: %w", killErr)
	}
	res.committed, res.achieved = len(commits), achieved
	// Everything committed must reach a pipe and end published: wait for it
	// (a claim held by a killed process comes back after the lease).
	wctx, wcancel := context.WithTimeout(ctx, r2DrainTimeout+r5Lease)
	defer wcancel()
	missing := maps.Clone(commits)
	_ = waitFor(wctx, func() (bool, error) {
		p.sink.mu.Lock()
		for id := range missing {
			if _, ok := p.sink.at[id]; ok {
				delete(missing, id)
			}
		}
		p.sink.mu.Unlock()
		if len(missing) > 0 {
			return false, nil
		}
		var pending int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE status = 'pending'`).Scan(&pending)
		return pending == 0, err
	})
	p.stopAll()
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE attempts > 1), count(*) FILTER (WHERE status <> 'published') FROM outbox_event`).Scan(&res.reclaimed, &res.unpublished); err != nil {
		return res, err
	}
	res.resume = p.resumes(killedAt, gens)
	p.sink.mu.Lock()
	defer p.sink.mu.Unlock()
	res.dups = p.sink.total - len(p.sink.seen)
	for id, c := range commits {
		a, ok := p.sink.at[id]
		if !ok {
			res.lost++
			continue
		}
		l := ms(a.Sub(c))
		isNear := false
		for _, k := range killedAt {
			if (c.Before(k) && a.After(k)) || (!c.Before(k) && c.Before(k.Add(2*time.Second))) {
				isNear = true
				break
			}
		}
		if isNear {
			res.near = append(res.near, l)
		} else {
			res.quiet = append(res.quiet, l)
		}
	}
	slices.Sort(res.near)
	slices.Sort(res.quiet)
	return res, nil
}

type r5Result struct {
	dups, lost int
	resume     []time.Duration
	el         time.Duration
}

func r5Once(ctx context.Context, pool *pgxpool.Pool, bin string, rows, batch int) (r5Result, error) {
	p := newR5Procs(pool, bin, batch)
	sink := p.sink
	start := time.Now()
	for i := range 2 {
		if _, err := p.start(i); err != nil {
			p.stopAll()
			return r5Result{}, err
		}
	}
	var res r5Result
	var killedAt []time.Time
	var gens []int
	tctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for _, frac := range []int{1, 2, 3} {
		if err := waitFor(tctx, func() (bool, error) { return sink.distinct() >= rows*frac/4, nil }); err != nil {
			p.stopAll()
			return r5Result{}, err
		}
		at, g, err := p.kill(0)
		if err != nil {
			p.stopAll()
			return r5Result{}, err
		}
		killedAt, gens = append(killedAt, at), append(gens, g)
	}
	err := waitFor(tctx, func() (bool, error) {
		if sink.distinct() < rows {
			return false, nil
		}
		var pending int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE status = 'pending'`).Scan(&pending)
		return pending == 0, err
	})
	res.el = time.Since(start)
	p.stopAll()
	if err != nil {
		return r5Result{}, fmt.Errorf("drain: %d of %d arrived: %w", sink.distinct(), rows, err)
	}
	res.resume = p.resumes(killedAt, gens)
	sink.mu.Lock()
	defer sink.mu.Unlock()
	res.dups = sink.total - len(sink.seen)
	res.lost = rows - len(sink.seen)
	return res, nil
}
