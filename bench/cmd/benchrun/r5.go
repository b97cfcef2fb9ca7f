package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// R5 crash: two relays, each a real process (bench/cmd/relayproc, whose
// broker is its stdout), drain a preload; one of them is killed with
// SIGKILL at a quarter, half and three quarters of the drain and started
// again at once. The sink (this process, reading both pipes) counts
// duplicates and checks that every event arrived and is marked published.
// A killed relay's claims come back when their lease (2 s here) expires.

func init() {
	register(50, "r5", runR5)
	flag.StringVar(&relayprocBin, "relayproc", "", "R5: relayproc binary (default: go build ./cmd/relayproc into a temporary directory)")
}

var relayprocBin string

const r5Lease = 2 * time.Second

type r5Sink struct {
	mu    sync.Mutex
	seen  map[string]int
	total int
	first map[int]time.Time // process generation → first line
}

func (s *r5Sink) read(gen int, f *os.File) {
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		s.mu.Lock()
		s.seen[sc.Text()]++
		s.total++
		if _, ok := s.first[gen]; !ok {
			s.first[gen] = time.Now()
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
	rows := e.size(e.o.rows, 20000)
	pool, err := e.newDB("r5")
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrateSluice(ctx, pool); err != nil {
		return err
	}
	dups := &wlResult{Workload: "R5", Metric: "duplicates at the sink (3 SIGKILLs)", System: "relay", Config: "2 relay processes, one killed 3×", Unit: "events"}
	lost := &wlResult{Workload: "R5", Metric: "events lost", System: "relay", Config: dups.Config, Unit: "events"}
	resume := &wlResult{Workload: "R5", Metric: "kill → restarted process's first publish", System: "relay", Config: dups.Config, Unit: "s"}
	elapsed := &wlResult{Workload: "R5", Metric: fmt.Sprintf("drain of %d events with the kills", rows), System: "relay", Config: dups.Config, Unit: "ev/s"}
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
		fmt.Printf("  run %d: %d events, %d distinct at the sink, %d duplicates, %d lost, %d marked published, %d claimed twice, resume %v, %.2fs\n",
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
	e.note("r5", "%d preloaded events (R1's shape), 2 relayproc processes (batch %d, lease %v, LISTEN on, poll 50 ms); process 0 gets SIGKILL when the sink has a quarter, half and three quarters of the events, and is started again at once; the sink is the processes' stdout (one write per event before its mark), read by the bench; a run is done when every event arrived and none is pending", rows, e.o.batch, r5Lease)
	return nil
}

type r5Result struct {
	dups, lost int
	resume     []time.Duration
	el         time.Duration
}

func r5Once(ctx context.Context, pool *pgxpool.Pool, bin string, rows, batch int) (r5Result, error) {
	sink := &r5Sink{seen: map[string]int{}, first: map[int]time.Time{}}
	var readers sync.WaitGroup
	var procs []*exec.Cmd
	gen := 0
	startProc := func(i int) (*exec.Cmd, error) {
		pr, pw, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(bin, "-db", pool.Config().ConnString(), "-name", fmt.Sprintf("relayproc-%d-%d", i, gen),
			"-batch", fmt.Sprint(batch), "-lease", r5Lease.String())
		cmd.Stdout, cmd.Stderr = pw, os.Stderr
		if err := cmd.Start(); err != nil {
			pr.Close()
			pw.Close()
			return nil, err
		}
		pw.Close()
		g := gen
		gen++
		readers.Go(func() { sink.read(g, pr); pr.Close() })
		return cmd, nil
	}
	stopAll := func() {
		for _, p := range procs {
			if p != nil && p.ProcessState == nil {
				_ = p.Process.Signal(syscall.SIGTERM)
				_ = p.Wait()
			}
		}
		readers.Wait()
	}
	start := time.Now()
	for i := range 2 {
		p, err := startProc(i)
		if err != nil {
			stopAll()
			return r5Result{}, err
		}
		procs = append(procs, p)
	}
	var res r5Result
	var killedAt []time.Time
	var restartGen []int
	tctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for _, frac := range []int{1, 2, 3} {
		if err := waitFor(tctx, func() (bool, error) { return sink.distinct() >= rows*frac/4, nil }); err != nil {
			stopAll()
			return r5Result{}, err
		}
		_ = procs[0].Process.Signal(syscall.SIGKILL)
		_ = procs[0].Wait()
		killedAt = append(killedAt, time.Now())
		restartGen = append(restartGen, gen)
		p, err := startProc(0)
		if err != nil {
			stopAll()
			return r5Result{}, err
		}
		procs[0] = p
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
	stopAll()
	if err != nil {
		return r5Result{}, fmt.Errorf("drain: %d of %d arrived: %w", sink.distinct(), rows, err)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	res.dups = sink.total - len(sink.seen)
	res.lost = rows - len(sink.seen)
	for i, k := range killedAt {
		if f, ok := sink.first[restartGen[i]]; ok {
			res.resume = append(res.resume, f.Sub(k).Round(time.Millisecond))
		}
	}
	slices.Sort(res.resume)
	return res, nil
}
