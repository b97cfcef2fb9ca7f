package main

// P1 payments (BENCH.md): the real payments service — HTTP, API key,
// idempotency record, reservation, the simulated provider in-process (or,
// with -payments-provider http, provider.Client to provider.Simulator over
// loopback HTTP), settlement — driven by concurrent POST /v1/payments with
// new keys plus 10% retries of old keys, against `pgbench -N` TPS with the
// same number of clients measured right before each run on the same server.
// Then an open loop at half the measured rate for the latency.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/payments/paymentsapi"
	"github.com/sluice-dev/sluice/internal/payments/provider"
	"github.com/sluice-dev/sluice/internal/pii"
)

// paymentsGoal is issue 12's goal: payments/s ÷ pgbench -N TPS.
const paymentsGoal = 0.35

// paymentsP99Goal is the open loop's p99 goal at half the measured rate.
const paymentsP99Goal = 50 * time.Millisecond

type paymentsRun struct {
	Load           string  `json:"loadavg"`
	PgbenchTPS     float64 `json:"pgbench_N_tps"`
	PaymentsPerSec float64 `json:"payments_per_sec"` // new payments answered 201
	RequestsPerSec float64 `json:"requests_per_sec"` // retries included
	Ratio          float64 `json:"ratio"`
	ClosedP50Ms    float64 `json:"closed_loop_p50_ms"`
	ClosedP99Ms    float64 `json:"closed_loop_p99_ms"`
	CommitsPerPay  float64 `json:"commits_per_payment"`    // pg_stat_database.xact_commit delta ÷ new payments (workers included)
	StmtsPerPay    float64 `json:"statements_per_payment"` // sent by the service's pool (pgx tracer), BEGIN and COMMIT included
	PoolWaitMsPay  float64 `json:"pool_wait_ms_per_payment"`
	ProviderMs     float64 `json:"provider_call_mean_ms"`
	CPUMsPerPay    float64 `json:"bench_process_cpu_ms_per_payment"` // clients, service and simulator
	// The database server's CPU (every postgres process, exited backends
	// included) per pgbench -N transaction and per payment, in the same
	// phases: what a payment costs the database in pgbench transactions,
	// whatever the bench process's own CPU takes from the shared cores.
	ServerCPUMsPerTx  float64 `json:"server_cpu_ms_per_pgbench_tx"`
	ServerCPUMsPerPay float64 `json:"server_cpu_ms_per_payment"`
	BenchCPUMsPerTx   float64 `json:"pgbench_process_cpu_ms_per_tx"`
	// The SQL floor (paymentsfloor.go): a payment's nine writes in two
	// transactions, run by pgbench with the same clients in its own phase.
	FloorPerSec         float64 `json:"floor_payments_per_sec"`
	FloorRatio          float64 `json:"floor_ratio"`       // floor ÷ pgbench -N TPS: the most any service could reach here
	OfFloor             float64 `json:"payments_of_floor"` // payments/s ÷ floor payments/s
	ServerCPUMsPerFloor float64 `json:"server_cpu_ms_per_floor_payment"`
	OpenRate            float64 `json:"open_loop_rate"`
	OpenP50Ms           float64 `json:"open_loop_p50_ms"`
	OpenP99Ms           float64 `json:"open_loop_p99_ms"`
	OpenErrors          int64   `json:"open_loop_errors"`
	Errors              int64   `json:"errors"`
	RetriesReplayed     int64   `json:"retries_replayed"`
}

type paymentsReport struct {
	Clients     int           `json:"clients"`
	Pool        int           `json:"db_pool_size"`
	Provider    string        `json:"provider"`
	WhatIfSQL   string        `json:"what_if_sql,omitempty"`
	Seconds     int           `json:"seconds_per_phase"`
	Runs        []paymentsRun `json:"runs"`
	MedianRatio float64       `json:"median_ratio"`
	MinRatio    float64       `json:"min_ratio"`
	MaxRatio    float64       `json:"max_ratio"`
	MedianP99Ms float64       `json:"median_open_loop_p99_ms"`
	// The SQL floor's ratio to pgbench -N and the service's to the floor,
	// medians of the runs.
	MedianFloorRatio float64 `json:"median_floor_ratio"`
	MedianOfFloor    float64 `json:"median_payments_of_floor"`
	// Ladder is floorLadder as measured (-payments-ladder), once per run of
	// the bench.
	Ladder    []ladderRow `json:"floor_ladder,omitempty"`
	Goal      float64     `json:"goal"`
	MeetsGoal bool        `json:"meets_goal"`
	MeetsP99  bool        `json:"meets_p99_goal"`
}

// countingTracer counts the statements the service's pool sends (BEGIN and
// COMMIT are statements too: pgx sends them through Exec).
type countingTracer struct{ n atomic.Int64 }

func (t *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	t.n.Add(1)
	return ctx
}
func (t *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// instantProvider is the simulated provider in-process, as BENCH.md defines
// P1: every charge succeeds at once (provider.Simulator's default), with no
// socket between the service and it, so the run measures the service and
// its database rather than a provider's HTTP server sharing their cores.
type instantProvider struct{}

func (instantProvider) Charge(_ context.Context, req provider.ChargeRequest) (provider.Result, error) {
	return provider.Result{OperationID: req.OperationID, Outcome: provider.Succeeded, ProviderRef: "sim_" + req.OperationID.String()[:8]}, nil
}

func (instantProvider) Inquire(_ context.Context, op uuid.UUID) (provider.Result, error) {
	return provider.Result{OperationID: op, Outcome: provider.Succeeded, ProviderRef: "sim_" + op.String()[:8]}, nil
}

// timedProvider measures the provider round trips.
type timedProvider struct {
	provider.Provider
	calls, micros atomic.Int64
}

func (p *timedProvider) Charge(ctx context.Context, req provider.ChargeRequest) (provider.Result, error) {
	start := time.Now()
	res, err := p.Provider.Charge(ctx, req)
	p.calls.Add(1)
	p.micros.Add(time.Since(start).Microseconds())
	return res, err
}

type paymentsEnv struct {
	pool    *pgxpool.Pool
	tracer  *countingTracer
	prov    *timedProvider
	url     string
	apiKey  string
	hc      *http.Client
	clients int
	seq     atomic.Int64
}

// runPaymentsWorkload runs P1 and stores its report in rep.
func runPaymentsWorkload(ctx context.Context, o options, admin *pgx.Conn, suffix string, rep *report) error {
	secs := 20
	if o.quick {
		secs = 10
	}
	clients, poolSize := 32, o.payPool
	name := "sluicebench_" + suffix + "_payments"
	pgbName := "sluicebench_" + suffix + "_pgbench32"
	floorName := "sluicebench_" + suffix + "_payfloor"
	ladderName := "sluicebench_" + suffix + "_payladder"
	for _, n := range []string{name, pgbName, floorName, ladderName} {
		if _, err := admin.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{n}.Sanitize()); err != nil {
			return err
		}
		defer admin.Exec(context.WithoutCancel(ctx), `DROP DATABASE IF EXISTS `+pgx.Identifier{n}.Sanitize()+` WITH (FORCE)`) //nolint:errcheck
	}
	pgbURL := withDB(o.adminURL, pgbName)
	if out, err := exec.CommandContext(ctx, "pgbench", "-i", "-q", "-s", "10", pgbURL).CombinedOutput(); err != nil {
		return fmt.Errorf("pgbench -i: %w: %s", err, out)
	}
	floorURL := withDB(o.adminURL, floorName)
	if err := setupFloor(ctx, floorURL, clients); err != nil {
		return err
	}
	var ladder []ladderRow
	if o.payLadder {
		// Before the service starts: the ladder's phases have the machine
		// to themselves.
		var err error
		if ladder, err = runFloorLadder(ctx, admin, withDB(o.adminURL, ladderName), pgbURL, clients, secs); err != nil {
			return err
		}
	}
	env, stop, err := startPayments(ctx, withDB(o.adminURL, name), clients, poolSize, o.payProvider, o.paySQL)
	if err != nil {
		return err
	}
	defer stop()
	pr := &paymentsReport{Clients: clients, Pool: poolSize, Provider: o.payProvider, WhatIfSQL: o.paySQL, Seconds: secs, Goal: paymentsGoal}
	pr.Ladder = ladder
	// Warm up: connections, prepared statements, the HTTP keep-alives.
	if _, err := env.closedLoop(ctx, 2*time.Second); err != nil {
		return err
	}
	if o.cpuprofile != "" && o.profileSys == "payments" {
		f, err := os.Create(o.cpuprofile + "-payments.pprof")
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	for r := 0; r < o.runs; r++ {
		var run paymentsRun
		if b, err := os.ReadFile("/proc/loadavg"); err == nil {
			run.Load = strings.Join(strings.Fields(string(b))[:3], " ")
		}
		// The service's idle connections are closed while pgbench runs: a
		// shared server's max_connections is not ours alone.
		env.pool.Reset()
		if err := quiesce(ctx, admin); err != nil {
			return err
		}
		srv0, self0 := serverCPU(), childCPU()
		if run.PgbenchTPS, err = pgbenchN(ctx, pgbURL, clients, secs); err != nil {
			return err
		}
		pgbTx := run.PgbenchTPS * float64(secs)
		srvTx := float64((serverCPU() - srv0).Microseconds()) / 1000 / pgbTx
		benchTx := float64((childCPU() - self0).Microseconds()) / 1000 / pgbTx
		if err := quiesce(ctx, admin); err != nil {
			return err
		}
		srv0 = serverCPU()
		floor, err := pgbenchFloor(ctx, floorURL, clients, secs, r+1, false)
		if err != nil {
			return err
		}
		floorCPU := float64((serverCPU() - srv0).Microseconds()) / 1000 / (floor * float64(secs))
		if _, err := env.closedLoop(ctx, time.Second); err != nil { // reconnect, prepare
			return err
		}
		if err := quiesce(ctx, admin); err != nil {
			return err
		}
		srv0 = serverCPU()
		res, err := env.closedLoop(ctx, time.Duration(secs)*time.Second)
		if err != nil {
			return err
		}
		if n := res.PaymentsPerSec * float64(secs); n > 0 {
			res.ServerCPUMsPerPay = float64((serverCPU() - srv0).Microseconds()) / 1000 / n
		}
		res.ServerCPUMsPerTx, res.BenchCPUMsPerTx = srvTx, benchTx
		res.Load, res.PgbenchTPS = run.Load, run.PgbenchTPS
		res.Ratio = res.PaymentsPerSec / res.PgbenchTPS
		res.FloorPerSec, res.FloorRatio, res.OfFloor, res.ServerCPUMsPerFloor = floor, floor/res.PgbenchTPS, res.PaymentsPerSec/floor, floorCPU
		res.OpenRate = res.PaymentsPerSec / 2
		if err := quiesce(ctx, admin); err != nil {
			return err
		}
		trace := ""
		if o.payTrace != "" {
			trace = fmt.Sprintf("%s-%d.csv", o.payTrace, r+1)
		}
		if err := env.openLoop(ctx, time.Duration(secs)*time.Second, &res, trace); err != nil {
			return err
		}
		pr.Runs = append(pr.Runs, res)
		fmt.Printf("  P1 run %d  pgbench -N %d clients %6.0f TPS | payments %6.0f/s (%.0f req/s) = %.3f× | closed p50 %.1f ms p99 %.1f ms | commits/pay %.2f stmts/pay %.1f pool wait %.2f ms/pay provider %.2f ms cpu %.2f ms/pay | open loop %.0f/s p50 %.1f ms p99 %.1f ms (errors %d) | server cpu %.2f ms/pay, %.2f ms/pgbench tx (pgbench itself %.2f ms/tx) | SQL floor %.0f/s = %.3f× of pgbench -N, server cpu %.2f ms/pay; payments ÷ floor %.2f× | load %s\n",
			r+1, clients, res.PgbenchTPS, res.PaymentsPerSec, res.RequestsPerSec, res.Ratio, res.ClosedP50Ms, res.ClosedP99Ms,
			res.CommitsPerPay, res.StmtsPerPay, res.PoolWaitMsPay, res.ProviderMs, res.CPUMsPerPay, res.OpenRate, res.OpenP50Ms, res.OpenP99Ms, res.OpenErrors, res.ServerCPUMsPerPay, res.ServerCPUMsPerTx, res.BenchCPUMsPerTx,
			res.FloorPerSec, res.FloorRatio, res.ServerCPUMsPerFloor, res.OfFloor, res.Load)
	}
	var ratios, p99s, floors, ofFloor []float64
	for _, r := range pr.Runs {
		ratios = append(ratios, r.Ratio)
		p99s = append(p99s, r.OpenP99Ms)
		floors = append(floors, r.FloorRatio)
		ofFloor = append(ofFloor, r.OfFloor)
	}
	slices.Sort(ratios)
	slices.Sort(p99s)
	slices.Sort(floors)
	slices.Sort(ofFloor)
	pr.MedianFloorRatio, pr.MedianOfFloor = median(floors), median(ofFloor)
	pr.MedianRatio, pr.MinRatio, pr.MaxRatio = median(ratios), ratios[0], ratios[len(ratios)-1]
	pr.MedianP99Ms = median(p99s)
	pr.MeetsGoal = pr.MedianRatio >= paymentsGoal
	pr.MeetsP99 = pr.MedianP99Ms <= float64(paymentsP99Goal.Milliseconds())
	rep.Payments = pr
	return nil
}

func printPayments(pr *paymentsReport) {
	if pr == nil {
		return
	}
	mark := func(ok bool) string { return map[bool]string{true: "✓", false: "✗"}[ok] }
	fmt.Printf("\nP1 payments (%d clients, service pool %d, provider %s, %d s per phase, %d run(s))\n", pr.Clients, pr.Pool, pr.Provider, pr.Seconds, len(pr.Runs))
	if pr.WhatIfSQL != "" {
		fmt.Printf("what-if: the service's schema was changed by -payments-sql (not the product's): %s\n", pr.WhatIfSQL)
	}
	fmt.Printf("payments/s ÷ pgbench -N TPS: %.3f× (%.3f–%.3f), goal %.2f× %s\n", pr.MedianRatio, pr.MinRatio, pr.MaxRatio, pr.Goal, mark(pr.MeetsGoal))
	fmt.Printf("open loop at half the rate: p99 %.1f ms, goal ≤ %d ms %s\n", pr.MedianP99Ms, paymentsP99Goal.Milliseconds(), mark(pr.MeetsP99))
	fmt.Printf("SQL floor (a payment's %d writes in %d transactions, run by pgbench; bench/README.md \"P1's SQL floor\"): %.3f× of pgbench -N; the service reaches %.2f× of the floor\n",
		floorWrites, floorCommits, pr.MedianFloorRatio, pr.MedianOfFloor)
}

// quiesce writes out what earlier phases left dirty before a measured phase
// starts (P1's phases, D1's measurements): a CHECKPOINT (shared buffers to the files, and their fsync), then
// sync(2) for what is left in the kernel's page cache. Without it, pgbench
// -i's ~160 MB and the previous phase's writes reached the disk 30 s later
// (the kernel's dirty_expire) in the middle of the next phase, and the WAL
// flushes of that phase waited behind them: open-loop stalls of 50-250 ms
// that were the harness's, not the service's (seen with -payments-trace and
// vmstat: 56-100 MB written back in one second, every request queued behind
// a WALSync). Every phase, pgbench's included, starts this way.
func quiesce(ctx context.Context, admin querier) error {
	if _, err := admin.Exec(ctx, `CHECKPOINT`); err != nil {
		return fmt.Errorf("checkpoint before a measured phase: %w", err)
	}
	syscall.Sync()
	return nil
}

func startPayments(ctx context.Context, url string, clients, poolSize int, prov, whatIf string) (*paymentsEnv, func(), error) {
	var stops []func()
	stop := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	fail := func(err error) (*paymentsEnv, func(), error) { stop(); return nil, nil, err }
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, nil, err
	}
	cfg.MaxConns = int32(poolSize)
	tr := &countingTracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := db.OpenConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	stops = append(stops, pool.Close)
	if _, err := db.Migrate(ctx, pool); err != nil {
		return fail(fmt.Errorf("migrate payments: %w", err))
	}
	if whatIf != "" {
		if _, err := pool.Exec(ctx, whatIf); err != nil {
			return fail(fmt.Errorf("-payments-sql: %w", err))
		}
	}
	keys, blind, err := pii.GenerateSpec("b1")
	if err != nil {
		return fail(err)
	}
	kr, err := pii.ParseKeyring(keys, blind)
	if err != nil {
		return fail(err)
	}
	if err := payments.CreateMerchant(ctx, pool, "m-bench", "bench merchant"); err != nil {
		return fail(err)
	}
	apiKey, _, err := payments.CreateKey(ctx, pool, "m-bench")
	if err != nil {
		return fail(err)
	}
	// One account per client, so the run measures the service and not one
	// hot account's row lock.
	for i := 1; i <= clients; i++ {
		if err := payments.CreateAccount(ctx, pool, "m-bench", int64(i), "TRY", decimal.NewFromInt(1_000_000_000)); err != nil {
			return fail(err)
		}
	}
	timed := &timedProvider{Provider: instantProvider{}}
	switch prov {
	case "inproc":
	case "http":
		sim := provider.NewSimulator(provider.SimConfig{})
		if err := sim.Start("127.0.0.1:0"); err != nil {
			return fail(err)
		}
		stops = append(stops, func() { _ = sim.Close() })
		timed.Provider = provider.NewClient(sim.URL(), 5*time.Second)
	default:
		return fail(fmt.Errorf("-payments-provider %q: want inproc or http", prov))
	}
	svc, err := payments.NewService(pool, timed, kr, payments.Config{}, nil, nil)
	if err != nil {
		return fail(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = svc.RunWorkers(wctx) }()
	stops = append(stops, func() { cancel(); <-done })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	h, err := paymentsapi.New(svc, paymentsapi.Config{AllowedHosts: paymentsapi.AllowedHosts(ln.Addr().String(), nil)})
	if err != nil {
		ln.Close()
		return fail(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	stops = append(stops, func() { _ = srv.Close() })
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConns: 4 * clients, MaxIdleConnsPerHost: 4 * clients}}
	return &paymentsEnv{pool: pool, tracer: tr, prov: timed, url: "http://" + ln.Addr().String() + "/v1/payments", apiKey: apiKey, hc: hc, clients: clients}, stop, nil
}

// pay sends one payment request; it returns the status.
func (e *paymentsEnv) pay(ctx context.Context, key, invoice string, account int64) (int, error) {
	body := fmt.Sprintf(`{"invoice_id":%q,"account_id":%d,"amount":"1.00","currency":"TRY","customer":{"name":"Ayşe Yılmaz","email":"ayse@example.com","tax_id":"12345678901"}}`, invoice, account)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+e.apiKey)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.hc.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

type paid struct {
	key, invoice string
	account      int64
}

// closedLoop runs the clients for d: each sends a new payment, or (one in
// ten) a retry of one of its earlier keys, which must replay 201.
func (e *paymentsEnv) closedLoop(ctx context.Context, d time.Duration) (paymentsRun, error) {
	var res paymentsRun
	before, err := commits(ctx, e.pool)
	if err != nil {
		return res, err
	}
	st0, stmts0, calls0, us0, cpu0 := e.pool.Stat(), e.tracer.n.Load(), e.prov.calls.Load(), e.prov.micros.Load(), cpuTime()
	var newPaid, retries, errs atomic.Int64
	lat := make([][]time.Duration, e.clients)
	end := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < e.clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			account := int64(c + 1)
			var mine []paid
			rng := rand.New(rand.NewPCG(uint64(c), uint64(time.Now().UnixNano())))
			for time.Now().Before(end) && ctx.Err() == nil {
				retry := len(mine) > 0 && rng.IntN(10) == 0
				var p paid
				if retry {
					p = mine[rng.IntN(len(mine))]
				} else {
					n := e.seq.Add(1)
					p = paid{key: uuid.NewString(), invoice: "inv-" + strconv.FormatInt(n, 10), account: account}
				}
				t0 := time.Now()
				status, err := e.pay(ctx, p.key, p.invoice, p.account)
				if err != nil || status != http.StatusCreated {
					errs.Add(1)
					continue
				}
				if retry {
					retries.Add(1)
					continue
				}
				lat[c] = append(lat[c], time.Since(t0))
				newPaid.Add(1)
				mine = append(mine, p)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	st1, stmts1, calls1, us1, cpu1 := e.pool.Stat(), e.tracer.n.Load(), e.prov.calls.Load(), e.prov.micros.Load(), cpuTime()
	after, err := commits(ctx, e.pool)
	if err != nil {
		return res, err
	}
	n := float64(newPaid.Load())
	if n == 0 {
		return res, fmt.Errorf("P1: no payment completed (%d errors)", errs.Load())
	}
	res.PaymentsPerSec = n / el.Seconds()
	res.RequestsPerSec = (n + float64(retries.Load())) / el.Seconds()
	res.RetriesReplayed, res.Errors = retries.Load(), errs.Load()
	res.CommitsPerPay = float64(after-before) / n
	res.StmtsPerPay = float64(stmts1-stmts0) / n
	res.PoolWaitMsPay = float64((st1.AcquireDuration() - st0.AcquireDuration()).Microseconds()) / 1000 / n
	if c := calls1 - calls0; c > 0 {
		res.ProviderMs = float64(us1-us0) / 1000 / float64(c)
	}
	res.CPUMsPerPay = float64((cpu1 - cpu0).Microseconds()) / 1000 / n
	all := slices.Concat(lat...)
	res.ClosedP50Ms, res.ClosedP99Ms = pctMs(all, 0.50), pctMs(all, 0.99)
	if res.Errors > 0 {
		return res, fmt.Errorf("P1: %d requests did not answer 201", res.Errors)
	}
	return res, nil
}

// openLoop sends new payments at res.OpenRate for d on a fixed schedule;
// a request's latency counts from its scheduled time, so a stall delays
// every request behind it and shows in the percentiles. With trace, every
// request's schedule and latency are written there (where the tail came
// from: a stall shows as latencies falling by the interval from one peak).
func (e *paymentsEnv) openLoop(ctx context.Context, d time.Duration, res *paymentsRun, trace string) error {
	if res.OpenRate <= 0 {
		return errors.New("P1: no rate for the open loop")
	}
	interval := time.Duration(float64(time.Second) / res.OpenRate)
	total := int(d / interval)
	lat := make([]time.Duration, total)
	var errs atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < total && ctx.Err() == nil; i++ {
		at := start.Add(time.Duration(i) * interval)
		if w := time.Until(at); w > 0 {
			time.Sleep(w)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := e.seq.Add(1)
			status, err := e.pay(ctx, uuid.NewString(), "inv-"+strconv.FormatInt(n, 10), int64(i%e.clients)+1)
			lat[i] = time.Since(at)
			if err != nil || status != http.StatusCreated {
				errs.Add(1)
			}
		}()
	}
	wg.Wait()
	if trace != "" {
		var b strings.Builder
		fmt.Fprintf(&b, "# open loop at %.0f/s from %s UTC: scheduled ms, latency ms\n", res.OpenRate, start.UTC().Format("15:04:05.000"))
		for i, l := range lat {
			fmt.Fprintf(&b, "%d,%.3f\n", (time.Duration(i) * interval).Milliseconds(), ms(l))
		}
		if err := os.WriteFile(trace, []byte(b.String()), 0o644); err != nil {
			return fmt.Errorf("P1: -payments-trace: %w", err)
		}
	}
	res.OpenP50Ms, res.OpenP99Ms, res.OpenErrors = pctMs(lat, 0.50), pctMs(lat, 0.99), errs.Load()
	if res.OpenErrors > 0 {
		return fmt.Errorf("P1 open loop: %d requests did not answer 201", res.OpenErrors)
	}
	return nil
}

// pctMs is pct (workloads.go) of latencies, in milliseconds; q is a fraction.
func pctMs(v []time.Duration, q float64) float64 {
	f := make([]float64, len(v))
	for i, d := range v {
		f[i] = ms(d)
	}
	return pct(f, q*100)
}

// commits reads the database's commit counter after letting the backends
// flush their statistics (PostgreSQL 15 flushes at most once a second).
func commits(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	time.Sleep(1100 * time.Millisecond)
	var n int64
	err := pool.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&n)
	return n, err
}

// pgbenchN is `pgbench -N` with clients on an initialized database.
func pgbenchN(ctx context.Context, url string, clients, secs int) (float64, error) {
	out, err := exec.CommandContext(ctx, "pgbench", "-N", "-n", "-c", strconv.Itoa(clients), "-j", "2", "-T", strconv.Itoa(secs), url).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("pgbench -N: %w: %s", err, out)
	}
	f := regexp.MustCompile(`tps = ([0-9.]+)`).FindSubmatch(out)
	if f == nil {
		return 0, fmt.Errorf("pgbench: no tps in %s", out)
	}
	return strconv.ParseFloat(string(f[1]), 64)
}

// serverCPU is the CPU time of the PostgreSQL server on this machine: every
// process named postgres (user + system), plus the children they reaped —
// the postmaster reaps exited backends, so pgbench's connections, gone when
// it ends, still count. Other databases' work on the server counts too: read
// it on a quiet machine.
func serverCPU() time.Duration {
	var total time.Duration
	for _, p := range readProcs() {
		if p.comm == "postgres" {
			total += p.cpu
		}
	}
	return total
}

// childCPU is the CPU time of the bench's exited child processes (pgbench).
func childCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
