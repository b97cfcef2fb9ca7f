// Command benchrun runs Sluice's benchmark workloads against same-run
// baselines and prints one table of ratios; bench/run is its front door
// (see bench/README.md): R1 (burn-down) here, the other workloads in their
// own files (r2.go … w1.go, see workloads.go).
package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log"
	"math"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/broker"
	sluiceconfig "github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/outbox"
)

type options struct {
	adminURL    string
	quick       bool
	rows        int
	wmRows      int
	runs        int
	relays      int
	batch       int
	relayBatch  int
	pgbenchSecs int
	out         string
	systems     string
	sinks       string
	cpuprofile  string
	profileSys  string
	poolSize    int
	explain     bool

	payPool     int    // P1's service pool
	payProvider string // P1's provider: inproc or http
	paySQL      string // P1: SQL run on the service's database after its migration (what-if runs)
	payTrace    string // P1: file for the open loop's latencies
	payLadder   bool   // P1: climb from the SQL floor to the product's schema first
	r2Trace     string // R2: file for the relays' events and statements
	r2Rates     string // R2: the fixed rates (comma list)
	r2Steps     int    // R2: the search's steps (-1: the mode's default)
	r2Held      bool   // R2: a dead letter and an event held behind it at the head of the relay's outbox
	r2Horizon   bool   // R2: a transaction holds a snapshot open on the relay's database for each run
	d1Churn     int    // D1: events published since the last vacuum in the churn phase (0: the mode's default)
	workloads   string
	consumeRows int
	rabbitURL   string
}

func main() {
	var o options
	flag.StringVar(&o.adminURL, "pg", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "PostgreSQL maintenance database URL (a superuser: creates and drops the bench databases)")
	flag.BoolVar(&o.quick, "quick", false, "quick mode: fewer rows and runs (see bench/README.md)")
	flag.IntVar(&o.rows, "rows", 0, "R1 preloaded rows (default 200000; quick 50000)")
	flag.IntVar(&o.wmRows, "wm-rows", 0, "R1 rows for watermill-sql (default 20000; quick 5000): it is much slower")
	flag.IntVar(&o.runs, "runs", 0, "runs per configuration (default 3; quick 1)")
	flag.IntVar(&o.relays, "relays", 2, "relays (and bare-loop workers)")
	flag.IntVar(&o.batch, "batch", 100, "relay and bare-loop batch size")
	flag.IntVar(&o.relayBatch, "relay-batch", outbox.DefaultBatchSize, "R1: the relay's batch size (default: the product's default, RELAY_BATCH_SIZE); the bare loop keeps -batch, as issue 12 defines it")
	flag.IntVar(&o.pgbenchSecs, "pgbench-seconds", 0, "pgbench -N duration (default 20; quick 8; 0 skips with -pgbench-seconds=-1)")
	flag.StringVar(&o.out, "out", "results/latest.json", "JSON results file")
	flag.StringVar(&o.systems, "systems", "", "comma list of systems to run (default all): relay (with relay-bulk, the relay under a bulk job),bare,river,watermill,payments (P1),consume,consume-drain")
	flag.StringVar(&o.sinks, "sinks", "null,nats", "comma list of sinks: null,nats,rabbit (the machine's RabbitMQ, -rabbit; R1's relay, bare loop and River, and C1)")
	flag.StringVar(&o.rabbitURL, "rabbit", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL of the rabbit sink")
	flag.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the -profile system's runs to FILE-<sink>.pprof")
	flag.StringVar(&o.profileSys, "profile", "relay", "system whose runs -cpuprofile covers")
	flag.IntVar(&o.poolSize, "pool", 10, "connections per system's pool (the same for all)")
	flag.IntVar(&o.payPool, "payments-pool", sluiceconfig.DefaultPaymentsPoolSize, "P1: the payments service's database pool (PAYMENTS_DB_POOL_SIZE)")
	flag.StringVar(&o.payProvider, "payments-provider", "inproc", "P1: the simulated provider: inproc (a Go call that succeeds at once, as BENCH.md defines P1) or http (provider.Client to provider.Simulator over loopback HTTP: both on the bench's cores)")
	flag.StringVar(&o.paySQL, "payments-sql", "", "P1: SQL run on the service's database after its migration, for what-if runs (e.g. 'DROP INDEX payment_invoice_idx'); the run is then not the product's")
	flag.BoolVar(&o.payLadder, "payments-ladder", false, "P1: before the runs, climb from the SQL floor to the product's schema one part at a time (bench/README.md \"P1's SQL floor\"), a floor and a pgbench -N phase per step")
	flag.StringVar(&o.payTrace, "payments-trace", "", "P1: write the open loop's requests (ms after its start, latency in ms) to FILE-<run>.csv")
	flag.StringVar(&o.r2Trace, "r2-trace", "", "R2: write each fixed-rate relay run's events (commit, ms after the loop's start; latency; the id's age at commit) and the relays' statements (start, duration, connection, statement) to FILE-<rate>-<run>.csv")
	flag.StringVar(&o.r2Rates, "r2-rates", "500,1000,2000", "R2: the fixed rates, events/s (comma list)")
	flag.IntVar(&d1Dead, "d1-dead", d1Dead, "D1: dead outbox events loaded, 1 to 50,000, each alone in its aggregate with one pending event held behind it")
	flag.IntVar(&o.d1Churn, "d1-churn", 0, "D1: events of the churn phase's topic published since the last vacuum (default 1,000,000; quick 200,000)")
	flag.BoolVar(&o.r2Horizon, "r2-horizon", false, "R2: a transaction holds a snapshot open on the relay's database through each relay run (as a long report, a backup or a standby's feedback does): no dead row version is removable meanwhile, nor its index entries marked dead")
	flag.BoolVar(&o.r2Held, "r2-held", false, "R2: before each relay run, a dead letter and an event of its aggregate held behind it at the head of the outbox (as whenever a dead letter waits for an operator), and autovacuum off on outbox_event (as on a large table between its visits: 20 % of its rows must be dead first); River has no counterpart")
	flag.IntVar(&o.r2Steps, "r2-steps", -1, "R2: at most this many steps of the search for the highest sustainable rate (default 8; quick 6; 0: no search)")
	flag.BoolVar(&o.explain, "explain", false, "print EXPLAIN (ANALYZE, BUFFERS) of the claim and mark half-way through a drain of -rows, then exit")
	flag.StringVar(&o.workloads, "workloads", "", "comma list of workloads (default all): "+strings.Join(workloadNames(), ","))
	flag.IntVar(&o.consumeRows, "consume-rows", 0, "C1 (consume, consume-drain) events (default 200000; quick 50000; the order check of issue 12 uses 1000000)")
	flag.Parse()
	def := func(v *int, full, quick int) {
		if *v == 0 {
			*v = full
			if o.quick {
				*v = quick
			}
		}
	}
	def(&o.rows, 200000, 50000)
	def(&o.wmRows, 20000, 5000)
	def(&o.runs, 3, 1)
	def(&o.pgbenchSecs, 20, 8)
	def(&o.consumeRows, 200000, 50000)
	if o.payProvider != "inproc" && o.payProvider != "http" {
		log.Printf("benchrun: -payments-provider %q: want inproc or http", o.payProvider)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		log.Printf("benchrun: %v", err)
		stop()
		os.Exit(1)
	}
}

type runResult struct {
	Seconds       float64 `json:"seconds"`
	EventsPerSec  float64 `json:"events_per_sec"`
	CPUSecs       float64 `json:"process_cpu_seconds"` // whole bench process, embedded NATS included
	CommitsPerEv  float64 `json:"commits_per_event,omitempty"`
	StmtsPerEv    float64 `json:"statements_per_event,omitempty"` // pg_stat_statements, when loaded
	HOTPercent    float64 `json:"hot_update_percent"`
	WALBytesPerEv float64 `json:"wal_bytes_per_event_clusterwide"` // includes other users of the server
	// DBCPUPerEv is the CPU the database's backends of this system's
	// database used per event (µs): what the statements cost the server,
	// which a busy machine's scheduling does not inflate the way it does
	// wall-clock rates. Autovacuum workers on the database count too.
	DBCPUPerEv float64 `json:"db_backend_cpu_us_per_event"`
}

type config struct {
	Workload string      `json:"workload"`
	Sink     string      `json:"sink"`
	System   string      `json:"system"` // relay, bare, river, watermill
	Config   string      `json:"config"`
	Rows     int         `json:"rows"`
	Runs     []runResult `json:"runs"`
	Median   float64     `json:"median_events_per_sec"`
	Min      float64     `json:"min_events_per_sec"`
	Max      float64     `json:"max_events_per_sec"`
}

type ratio struct {
	Sink      string  `json:"sink"`
	Name      string  `json:"name"`
	Of        string  `json:"of"`
	Over      string  `json:"over"`
	Median    float64 `json:"median"`
	Low       float64 `json:"low"`  // relay min ÷ peer max
	High      float64 `json:"high"` // relay max ÷ peer min
	Goal      float64 `json:"goal,omitempty"`
	MeetsGoal bool    `json:"meets_goal"`
}

type report struct {
	Started  time.Time      `json:"started"`
	Finished time.Time      `json:"finished"`
	Mode     string         `json:"mode"`
	Commit   string         `json:"commit"`
	Machine  map[string]any `json:"machine"`
	Notes    []string       `json:"notes"`
	Configs  []*config      `json:"configs"`
	Ratios   []ratio        `json:"ratios"`

	Payments *paymentsReport `json:"payments,omitempty"` // P1
	extraReport
}

func run(ctx context.Context, o options) error {
	rep := &report{Started: time.Now().UTC(), Mode: map[bool]string{true: "quick", false: "full"}[o.quick]}
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		rep.Commit = strings.TrimSpace(string(out))
		if st, _ := exec.Command("git", "status", "--porcelain", "--", "..").Output(); len(st) > 0 {
			rep.Commit += "+dirty"
		}
	}
	admin, err := pgx.Connect(ctx, o.adminURL)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", o.adminURL, err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	rep.Machine, err = machine(ctx, admin)
	if err != nil {
		return err
	}
	suffix := randomSuffix()
	dbs := map[string]string{}
	defer func() {
		for _, name := range dbs {
			if os.Getenv("BENCH_KEEP_DBS") != "" { // to look at plans on the run's data afterwards
				log.Printf("kept database %s", name)
				continue
			}
			if _, err := admin.Exec(context.WithoutCancel(ctx), `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`); err != nil {
				log.Printf("drop %s: %v", name, err)
			}
		}
	}()
	newDB := func(kind string) (*pgxpool.Pool, error) {
		name := "sluicebench_" + suffix + "_" + kind
		if _, err := admin.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()); err != nil {
			return nil, err
		}
		dbs[kind] = name
		cfg, err := pgxpool.ParseConfig(withDB(o.adminURL, name))
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = int32(o.poolSize)
		return pgxpool.NewWithConfig(ctx, cfg)
	}

	if o.explain {
		pool, err := newDB("sluice")
		if err != nil {
			return err
		}
		defer pool.Close()
		if err := migrateSluice(ctx, pool); err != nil {
			return err
		}
		if err := explainClaim(ctx, pool, o.rows, bareClaimSQL); err != nil && !errors.Is(err, errRollback) {
			return err
		}
		return nil
	}
	if o.pgbenchSecs > 0 {
		tps, clients, err := pgbench(ctx, admin, o, suffix)
		if err != nil {
			return fmt.Errorf("pgbench: %w", err)
		}
		rep.Machine["pgbench_N_tps"] = tps
		rep.Machine["pgbench_N_clients"] = clients
		fmt.Printf("pgbench -N: %.0f TPS (%d clients, %ds)\n", tps, clients, o.pgbenchSecs)
	}

	if err := runWorkloads(ctx, o, rep, newDB); err != nil {
		return err
	}
	if !wantWorkload(o, "r1") {
		return finish(rep, o)
	}
	r1Start := sampleCPU()
	want := func(list, x string) bool { return list == "" || slices.Contains(strings.Split(list, ","), x) }
	type system struct {
		kind, config string
		sinks        []string // nil: every sink
		rows         int
		pool         *pgxpool.Pool
		preload      func(context.Context, *pgxpool.Pool, int) error
		table        string
		run          func(context.Context, *pgxpool.Pool, broker.Publisher, int) (time.Duration, error)
	}
	var systems []system
	if want(o.systems, "payments") {
		if err := runPaymentsWorkload(ctx, o, admin, suffix, rep); err != nil {
			return fmt.Errorf("P1 payments: %w", err)
		}
	}
	if want(o.systems, "relay") || want(o.systems, "bare") {
		pool, err := newDB("sluice")
		if err != nil {
			return err
		}
		defer pool.Close()
		if err := migrateSluice(ctx, pool); err != nil {
			return fmt.Errorf("migrate sluice: %w", err)
		}
		rb := cmp.Or(o.relayBatch, o.batch) // the relay's batch, with and without a bulk job (B1 compares the two)
		if want(o.systems, "relay") {
			systems = append(systems, system{kind: "relay", config: fmt.Sprintf("%d relays, batch %d, ordered", o.relays, rb), rows: o.rows, pool: pool,
				preload: preloadOutbox, table: "outbox_event",
				run: func(ctx context.Context, p *pgxpool.Pool, pub broker.Publisher, n int) (time.Duration, error) {
					return runRelay(ctx, p, pub, n, o.relays, rb, true)
				}})
		}
		if want(o.systems, "relay") && os.Getenv("BENCH_NO_BULK") == "" {
			systems = append(systems, system{kind: "relay-bulk", config: fmt.Sprintf("%d relays, batch %d, ordered, while a bulk job discards %d× as many dead events", o.relays, rb, bulkDeadFactor),
				rows: o.rows, pool: pool, preload: preloadOutboxAndJob, table: "outbox_event",
				run: func(ctx context.Context, p *pgxpool.Pool, pub broker.Publisher, n int) (time.Duration, error) {
					return runRelayUnderJob(ctx, p, pub, n, o.relays, rb)
				}})
		}
		if want(o.systems, "bare") {
			systems = append(systems, system{kind: "bare", config: fmt.Sprintf("%d workers, batch %d, claim+mark of 09e153b", o.relays, o.batch), rows: o.rows, pool: pool,
				preload: preloadOutbox, table: "outbox_event",
				run: func(ctx context.Context, p *pgxpool.Pool, pub broker.Publisher, n int) (time.Duration, error) {
					if _, null := pub.(*nullSink); null {
						pub = nil // the ceiling: no publish at all
					}
					return runBare(ctx, p, pub, n, o.relays, o.batch)
				}})
		}
	}
	if want(o.systems, "river") {
		pool, err := newDB("river")
		if err != nil {
			return err
		}
		defer pool.Close()
		if err := migrateRiver(ctx, pool); err != nil {
			return fmt.Errorf("migrate river: %w", err)
		}
		for _, rc := range riverConfigs {
			systems = append(systems, system{kind: "river", config: rc.Name, rows: o.rows, pool: pool,
				preload: preloadRiver, table: "river_job",
				run: func(ctx context.Context, p *pgxpool.Pool, pub broker.Publisher, n int) (time.Duration, error) {
					return runRiver(ctx, p, pub, n, rc)
				}})
		}
	}
	if want(o.systems, "watermill") {
		pool, err := newDB("watermill")
		if err != nil {
			return err
		}
		defer pool.Close()
		systems = append(systems, system{kind: "watermill", config: "watermill-sql v4 forwarder, default schema, batch 100", sinks: []string{"nats"}, rows: o.wmRows, pool: pool,
			preload: preloadWatermill, table: "watermill_" + wmForwarderTopic, run: runWatermill})
	}

	if want(o.systems, "consume") || want(o.systems, "consume-drain") {
		// C1 (consume.go): the sharded consumer, with and without the relays.
		pool, err := newDB("consume")
		if err != nil {
			return err
		}
		defer pool.Close()
		if err := migrateSluice(ctx, pool); err != nil {
			return fmt.Errorf("migrate consume: %w", err)
		}
		for _, c := range []struct {
			kind string
			run  func(context.Context, *pgxpool.Pool, broker.Publisher, int, int, int) (time.Duration, error)
		}{{"consume", runConsume}, {"consume-drain", runConsumeDrain}} {
			kind, run := c.kind, c.run
			if !want(o.systems, kind) {
				continue
			}
			systems = append(systems, system{kind: kind, config: consumeConfig(o), sinks: []string{"nats", "rabbit"}, rows: o.consumeRows, pool: pool,
				preload: preloadConsume, table: "consume_effect",
				run: func(ctx context.Context, p *pgxpool.Pool, pub broker.Publisher, n int) (time.Duration, error) {
					return run(ctx, p, pub, n, o.relays, o.batch)
				}})
		}
	}

	var sinks []sink
	for _, s := range strings.Split(o.sinks, ",") {
		if len(systems) == 0 {
			break // P1 only
		}
		switch s {
		case "null":
			sinks = append(sinks, &nullSink{})
		case "nats":
			ns, err := startNATS(ctx)
			if err != nil {
				return fmt.Errorf("embedded NATS: %w", err)
			}
			defer ns.close()
			sinks = append(sinks, ns)
		case "rabbit":
			rs, err := startRabbit(ctx, o.rabbitURL)
			if err != nil {
				return err
			}
			defer rs.close()
			sinks = append(sinks, rs)
		default:
			return fmt.Errorf("unknown sink %q", s)
		}
	}

	results := map[string]*config{}
	var order []string
	pgss := map[*pgxpool.Pool]bool{}
	for _, s := range systems {
		if _, seen := pgss[s.pool]; !seen {
			_, err := s.pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
			if err == nil {
				_, err = s.pool.Exec(ctx, `SELECT pg_stat_statements_reset()`)
			}
			pgss[s.pool] = err == nil
		}
	}
	if len(systems) > 0 && !pgss[systems[0].pool] {
		rep.Notes = append(rep.Notes, "pg_stat_statements is not loaded (shared_preload_libraries): statements per event not recorded")
	}
	// Runs are interleaved (rep → sink → system) so slow phases of a shared
	// machine spread over every system instead of hitting one.
	for r := 0; r < o.runs; r++ {
		for _, sk := range sinks {
			for _, s := range systems {
				if s.sinks != nil && !slices.Contains(s.sinks, sk.name()) {
					continue
				}
				key := sk.name() + "|" + s.kind + "|" + s.config
				c := results[key]
				if c == nil {
					c = &config{Workload: "R1", Sink: sk.name(), System: s.kind, Config: s.config, Rows: s.rows}
					results[key] = c
					order = append(order, key)
				}
				if err := s.preload(ctx, s.pool, s.rows); err != nil {
					return fmt.Errorf("%s preload: %w", key, err)
				}
				if err := sk.reset(ctx); err != nil {
					return fmt.Errorf("reset sink: %w", err)
				}
				var prof *os.File
				if o.cpuprofile != "" && s.kind == o.profileSys {
					prof, err = os.Create(fmt.Sprintf("%s-%s.pprof", o.cpuprofile, sk.name()))
					if err != nil {
						return err
					}
					if err := pprof.StartCPUProfile(prof); err != nil {
						return err
					}
				}
				before, err := snapshot(ctx, s.pool, s.table, pgss[s.pool])
				if err != nil {
					return err
				}
				cpu0 := cpuTime()
				db0, err := backendCPU(ctx, s.pool)
				if err != nil {
					return err
				}
				// 15 minutes per 200,000 events (C1's 1,000,000-event check
				// needs more on a loaded machine).
				rctx, cancel := context.WithTimeout(ctx, max(15*time.Minute, time.Duration(s.rows/200000)*15*time.Minute))
				el, err := s.run(rctx, s.pool, sk, s.rows)
				cancel()
				cpu := cpuTime() - cpu0
				db1, dbErr := backendCPU(ctx, s.pool)
				if prof != nil {
					pprof.StopCPUProfile()
					prof.Close()
				}
				if err != nil {
					return fmt.Errorf("%s run %d: %w", key, r+1, err)
				}
				if dbErr != nil {
					return dbErr
				}
				after, err := snapshot(ctx, s.pool, s.table, pgss[s.pool])
				if err != nil {
					return err
				}
				n := float64(s.rows)
				var dbCPU time.Duration
				for pid, t := range db1 {
					dbCPU += t - db0[pid] // a backend started during the run counts whole
				}
				rr := runResult{
					Seconds: el.Seconds(), EventsPerSec: n / el.Seconds(), CPUSecs: cpu.Seconds(),
					CommitsPerEv:  float64(after.commits-before.commits) / n,
					StmtsPerEv:    float64(after.stmts-before.stmts) / n,
					WALBytesPerEv: float64(after.wal-before.wal) / n,
					DBCPUPerEv:    float64(dbCPU.Microseconds()) / n,
				}
				if upd := after.upd - before.upd; upd > 0 {
					rr.HOTPercent = 100 * float64(after.hot-before.hot) / float64(upd)
				}
				c.Runs = append(c.Runs, rr)
				fmt.Printf("  run %d  %-5s %-9s %-45s %7d ev in %6.2fs = %8.0f ev/s  cpu %.1fs  db cpu %.0f µs/ev  commits/ev %.3f  HOT %.0f%%\n",
					r+1, sk.name(), s.kind, s.config, s.rows, el.Seconds(), rr.EventsPerSec, rr.CPUSecs, rr.DBCPUPerEv, rr.CommitsPerEv, rr.HOTPercent)
			}
		}
	}
	for _, k := range order {
		c := results[k]
		var v []float64
		for _, r := range c.Runs {
			v = append(v, r.EventsPerSec)
		}
		slices.Sort(v)
		c.Median, c.Min, c.Max = median(v), v[0], v[len(v)-1]
		rep.Configs = append(rep.Configs, c)
	}
	rep.Ratios = ratios(rep.Configs)
	rep.Notes = append(rep.Notes,
		fmt.Sprintf("R1: %d rows (watermill %d), ~%d B payload, %d events per aggregate round-robin, %d run(s) per configuration; median and min–max", o.rows, o.wmRows, len(payload), eventsPerAggregate, o.runs),
		"river: best of the stated configurations per sink (by median)",
		"bare (null sink) publishes nothing; bare (nats) sends the batch as async JetStream publishes and waits once for all acks",
		"watermill: nats sink only, fewer rows (it is one message at a time)",
		"process_cpu_seconds covers the whole bench process, the embedded NATS server included")
	addTiming(rep, "r1", r1Start) // R1's systems, with B1 and P1 when they run
	printTable(rep)
	return finish(rep, o)
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

func ratios(cs []*config) []ratio {
	var out []ratio
	for _, sink := range []string{"null", "nats", "rabbit"} {
		// Issue 12's goals are on the null sink and JetStream; RabbitMQ's
		// ratios are shown without one.
		goals := sink != "rabbit"
		var relay, bare, riverBest, wm, underJob *config
		for _, c := range cs {
			if c.Sink != sink {
				continue
			}
			switch c.System {
			case "relay":
				relay = c
			case "bare":
				bare = c
			case "river":
				if riverBest == nil || c.Median > riverBest.Median {
					riverBest = c
				}
			case "watermill":
				wm = c
			case "relay-bulk":
				underJob = c
			}
		}
		if relay == nil {
			continue
		}
		add := func(name string, peer *config, goal float64) {
			if peer == nil {
				return
			}
			r := ratio{Sink: sink, Name: name, Of: relay.Config, Over: peer.System + " " + peer.Config,
				Median: relay.Median / peer.Median, Low: relay.Min / peer.Max, High: relay.Max / peer.Min, Goal: goal}
			if !goals {
				r.Goal = 0
			}
			r.MeetsGoal = r.Goal == 0 || r.Median >= r.Goal
			out = append(out, r)
		}
		add("relay ÷ River best", riverBest, 1.5)
		add("relay ÷ bare loop", bare, 1.2)
		add("relay ÷ watermill-sql", wm, 0)
		if underJob != nil {
			// B1: the same relay while a bulk job runs, over the idle one.
			r := ratio{Sink: sink, Name: "relay under a bulk job ÷ idle relay", Of: underJob.Config, Over: relay.System + " " + relay.Config,
				Median: underJob.Median / relay.Median, Low: underJob.Min / relay.Max, High: underJob.Max / relay.Min}
			if goals {
				r.Goal = 0.5
			}
			r.MeetsGoal = r.Goal == 0 || r.Median >= r.Goal
			out = append(out, r)
		}
	}
	return out
}

// ratioText prints a ratio to two decimals, or to as many more as it takes
// to tell it from its goal: 1.1999 printed as "1.20×" beside "1.2× ✗" reads
// as a wrong mark.
func ratioText(v, goal float64) string {
	for prec := 2; prec <= 6; prec++ {
		scale := math.Pow(10, float64(prec))
		if goal <= 0 || (math.Round(v*scale)/scale >= goal) == (v >= goal) {
			return strconv.FormatFloat(v, 'f', prec, 64) + "×"
		}
	}
	return strconv.FormatFloat(v, 'g', -1, 64) + "×"
}

func printTable(rep *report) {
	fmt.Printf("\nR1 burn-down (%s mode, commit %s, nproc %v, %v)\n", rep.Mode, rep.Commit, rep.Machine["nproc"], rep.Machine["server_version"])
	if tps, ok := rep.Machine["pgbench_N_tps"]; ok {
		fmt.Printf("pgbench -N: %.0f TPS; load average at start: %v\n", tps, rep.Machine["loadavg"])
	}
	fmt.Printf("\n%-6s %-10s %-48s %5s %10s %21s\n", "sink", "system", "configuration", "runs", "median/s", "min–max/s")
	for _, c := range rep.Configs {
		fmt.Printf("%-6s %-10s %-48s %5d %10.0f %10.0f–%-10.0f\n", c.Sink, c.System, c.Config, len(c.Runs), c.Median, c.Min, c.Max)
	}
	fmt.Printf("\n%-6s %-24s %8s %15s %6s  %s\n", "sink", "ratio", "median", "range", "goal", "peer")
	for _, r := range rep.Ratios {
		goal := "—"
		if r.Goal > 0 {
			goal = fmt.Sprintf("%.1f×", r.Goal)
			if r.MeetsGoal {
				goal += " ✓"
			} else {
				goal += " ✗"
			}
		}
		fmt.Printf("%-6s %-24s %8s %6.2f–%-6.2f %8s  %s\n", r.Sink, r.Name, ratioText(r.Median, r.Goal), r.Low, r.High, goal, r.Over)
	}
	printPayments(rep.Payments)
	for _, n := range rep.Notes {
		fmt.Println("note:", n)
	}
}

type stats struct{ commits, upd, hot, stmts, wal int64 }

// snapshot reads the database's counters after letting the backends flush
// their statistics (PostgreSQL 15 flushes at most once a second).
func snapshot(ctx context.Context, pool *pgxpool.Pool, table string, pgss bool) (stats, error) {
	time.Sleep(1100 * time.Millisecond)
	var s stats
	err := pool.QueryRow(ctx, `
		SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
		       coalesce((SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = $1), 0),
		       coalesce((SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = $1), 0),
		       pg_current_wal_lsn() - '0/0'::pg_lsn`, table).Scan(&s.commits, &s.upd, &s.hot, &s.wal)
	if err != nil {
		return s, fmt.Errorf("statistics: %w", err)
	}
	if pgss {
		if err := pool.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&s.stmts); err != nil {
			return s, err
		}
	}
	return s, nil
}

// backendCPU reads the CPU time (user + system) of every backend connected
// to pool's database, by process id, from /proc (the server runs on this
// machine). A backend that exits before the second reading is lost; the
// systems' pools keep their connections for the whole run.
func backendCPU(ctx context.Context, pool *pgxpool.Pool) (map[int]time.Duration, error) {
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	if err != nil {
		return nil, fmt.Errorf("backend cpu: %w", err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("backend cpu: %w", err)
	}
	out := make(map[int]time.Duration, len(pids))
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // exited, or a server on another machine: nothing to read
		}
		// Fields after the command's closing parenthesis: utime and stime
		// are the 12th and 13th (clock ticks of 10 ms on Linux).
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		out[int(pid)] = time.Duration(ut+st) * 10 * time.Millisecond
	}
	return out, nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func machine(ctx context.Context, c *pgx.Conn) (map[string]any, error) {
	m := map[string]any{"nproc": runtime.NumCPU(), "go": runtime.Version()}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m["loadavg"] = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if f := regexp.MustCompile(`MemTotal:\s+(\d+)`).FindSubmatch(b); f != nil {
			kb, _ := strconv.Atoi(string(f[1]))
			m["mem_gib"] = float64(kb) / (1 << 20)
		}
	}
	settings := map[string]string{}
	rows, err := c.Query(ctx, `SELECT name, setting || coalesce(' ' || unit, '') FROM pg_settings WHERE name = ANY($1)`,
		[]string{"server_version", "shared_buffers", "synchronous_commit", "fsync", "full_page_writes", "wal_level",
			"max_wal_size", "checkpoint_timeout", "commit_delay", "wal_sync_method", "max_connections", "work_mem",
			"shared_preload_libraries", "effective_io_concurrency", "random_page_cost"})
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, err
		}
		settings[k] = v
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	m["server_version"] = "PostgreSQL " + settings["server_version"]
	m["pg_settings"] = settings
	fmt.Printf("machine: nproc %d, load %v, %s; shared_buffers %s, synchronous_commit %s, fsync %s, max_wal_size %s\n",
		runtime.NumCPU(), m["loadavg"], m["server_version"], settings["shared_buffers"], settings["synchronous_commit"], settings["fsync"], settings["max_wal_size"])
	return m, nil
}

// pgbench measures the commit ceiling: pgbench -N (one small write
// transaction per commit, no tellers/branches contention) on a throwaway
// database.
func pgbench(ctx context.Context, admin *pgx.Conn, o options, suffix string) (float64, int, error) {
	if _, err := exec.LookPath("pgbench"); err != nil {
		return 0, 0, errors.New("pgbench not found: apt-get install -y postgresql-client (or postgresql-contrib); bench/run installs it")
	}
	name := "sluicebench_" + suffix + "_pgbench"
	if _, err := admin.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()); err != nil {
		return 0, 0, err
	}
	defer admin.Exec(context.WithoutCancel(ctx), `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`) //nolint:errcheck
	u := withDB(o.adminURL, name)
	if out, err := exec.CommandContext(ctx, "pgbench", "-i", "-q", "-s", "10", u).CombinedOutput(); err != nil {
		return 0, 0, fmt.Errorf("pgbench -i: %w: %s", err, out)
	}
	clients := 16
	out, err := exec.CommandContext(ctx, "pgbench", "-N", "-n", "-c", strconv.Itoa(clients), "-j", "2", "-T", strconv.Itoa(o.pgbenchSecs), u).CombinedOutput()
	if err != nil {
		return 0, 0, fmt.Errorf("pgbench -N: %w: %s", err, out)
	}
	f := regexp.MustCompile(`tps = ([0-9.]+)`).FindSubmatch(out)
	if f == nil {
		return 0, 0, fmt.Errorf("pgbench: no tps in %s", out)
	}
	tps, _ := strconv.ParseFloat(string(f[1]), 64)
	return tps, clients, nil
}

func withDB(raw, name string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	u.Path = "/" + name
	return u.String()
}

func dirOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return "."
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
