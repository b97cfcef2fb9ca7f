package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The workloads besides R1 (BENCH.md): each registers itself from its own
// file (r2.go, d1.go, …) and records rows of one shared table.

type workloadEnv struct {
	o     options
	rep   *report
	newDB func(kind string) (*pgxpool.Pool, error)
}

type workload struct {
	order int
	name  string
	run   func(ctx context.Context, e *workloadEnv) error
}

var registered []workload

func register(order int, name string, run func(context.Context, *workloadEnv) error) {
	registered = append(registered, workload{order, name, run})
}

func workloadNames() []string {
	names := []string{"r1"}
	slices.SortFunc(registered, func(a, b workload) int { return a.order - b.order })
	for _, w := range registered {
		names = append(names, w.name)
	}
	return names
}

func wantWorkload(o options, name string) bool {
	return o.workloads == "" || slices.Contains(strings.Split(o.workloads, ","), name)
}

// extraReport is what the workloads besides R1 add to latest.json.
type extraReport struct {
	Results []*wlResult   `json:"workload_results,omitempty"`
	Plans   []queryPlan   `json:"plans,omitempty"`
	Timing  []wlDuration  `json:"workload_seconds,omitempty"`
	Extra   []wlDataShape `json:"workload_data,omitempty"`
}

type wlDuration struct {
	Workload  string  `json:"workload"`
	Seconds   float64 `json:"seconds"`
	cpuShares         // who else used the machine meanwhile (machinecpu.go)
}

// timed runs f as workload name (see addTiming).
func timed(rep *report, name string, f func() error) error {
	start := sampleCPU()
	if err := f(); err != nil {
		return err
	}
	addTiming(rep, name, start)
	return nil
}

// addTiming puts workload name's time since start, and the machine's CPU
// used by others meanwhile, in rep.Timing, and prints them at once.
func addTiming(rep *report, name string, start cpuSample) {
	end := sampleCPU()
	d := wlDuration{Workload: name, Seconds: end.at.Sub(start.at).Seconds(), cpuShares: end.sharesSince(start)}
	rep.Timing = append(rep.Timing, d)
	fmt.Printf("  %s: %s\n", strings.ToUpper(name), d.cpuShares)
}

type wlDataShape struct {
	Workload string `json:"workload"`
	Note     string `json:"note"`
}

type queryPlan struct {
	Workload string `json:"workload"`
	Name     string `json:"name"`
	Plan     string `json:"plan"`
}

// wlResult is one row of the workloads' table: a measured figure (median
// of the runs, min–max), its same-run baseline and the goal.
type wlResult struct {
	Workload       string         `json:"workload"`
	Metric         string         `json:"metric"`
	System         string         `json:"system"`
	Config         string         `json:"config,omitempty"`
	Unit           string         `json:"unit"`
	Runs           []float64      `json:"runs"`
	Median         float64        `json:"median"`
	Min            float64        `json:"min"`
	Max            float64        `json:"max"`
	Baseline       string         `json:"baseline,omitempty"`
	BaselineMedian float64        `json:"baseline_median,omitempty"`
	Ratio          float64        `json:"ratio,omitempty"` // this ÷ baseline
	Goal           string         `json:"goal,omitempty"`
	Pass           *bool          `json:"pass,omitempty"`
	Details        map[string]any `json:"details,omitempty"`
}

func (r *wlResult) settle() *wlResult {
	v := slices.Clone(r.Runs)
	slices.Sort(v)
	if len(v) > 0 {
		r.Median, r.Min, r.Max = median(v), v[0], v[len(v)-1]
	}
	return r
}

// against sets the baseline and the ratio.
func (r *wlResult) against(b *wlResult) *wlResult {
	if b == nil || b.Median == 0 {
		return r
	}
	r.Baseline = b.System + " " + b.Config
	r.BaselineMedian = b.Median
	r.Ratio = r.Median / b.Median
	return r
}

func (r *wlResult) goal(text string, pass bool) *wlResult {
	r.Goal, r.Pass = text, &pass
	return r
}

func (e *workloadEnv) add(r *wlResult) *wlResult {
	e.rep.Results = append(e.rep.Results, r.settle())
	fmt.Printf("  %-3s %-52s %-34s %12s %s\n", r.Workload, trunc(r.Metric, 52), trunc(r.System+" "+r.Config, 34), fmtVal(r.Median), r.Unit)
	return r
}

func (e *workloadEnv) plan(workload, name, plan string) {
	e.rep.Plans = append(e.rep.Plans, queryPlan{workload, name, plan})
	fmt.Printf("\n-- %s %s\n%s\n", workload, name, plan)
}

func (e *workloadEnv) note(workload, format string, a ...any) {
	e.rep.Extra = append(e.rep.Extra, wlDataShape{workload, fmt.Sprintf(format, a...)})
}

// explain returns EXPLAIN (ANALYZE, BUFFERS) of sql in a transaction that is
// rolled back.
func explain(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) (string, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	r, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+sql, args...)
	if err != nil {
		return "", err
	}
	lines, err := pgx.CollectRows(r, pgx.RowTo[string])
	if err != nil {
		return "", err
	}
	return strings.Join(lines, "\n"), nil
}

func runWorkloads(ctx context.Context, o options, rep *report, newDB func(string) (*pgxpool.Pool, error)) error {
	workloadNames() // sorts
	e := &workloadEnv{o: o, rep: rep, newDB: newDB}
	for _, w := range registered {
		if !wantWorkload(o, w.name) {
			continue
		}
		fmt.Printf("\n== %s\n", strings.ToUpper(w.name))
		if err := timed(rep, w.name, func() error { return w.run(ctx, e) }); err != nil {
			return fmt.Errorf("%s: %w", w.name, err)
		}
		// Keep what is measured so far should a later workload fail.
		if err := writeReport(rep, o); err != nil {
			return err
		}
	}
	return nil
}

func finish(rep *report, o options) error {
	rep.Finished = time.Now().UTC()
	printWorkloads(rep)
	return writeReport(rep, o)
}

func writeReport(rep *report, o options) error {
	if err := os.MkdirAll(dirOf(o.out), 0o755); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(rep, "", "  ")
	return os.WriteFile(o.out, append(b, '\n'), 0o644)
}

func printWorkloads(rep *report) {
	if len(rep.Results) == 0 {
		printTiming(rep)
		return
	}
	fmt.Printf("\nWorkloads (%s mode, commit %s, load average at start %v)\n", rep.Mode, rep.Commit, rep.Machine["loadavg"])
	fmt.Printf("%-3s %-52s %-34s %-10s %21s %-6s %-30s %8s  %s\n", "id", "metric", "system", "median", "min–max", "unit", "baseline (median)", "ratio", "goal")
	for _, r := range rep.Results {
		base, ratio := "—", "—"
		if r.Baseline != "" {
			base = fmt.Sprintf("%s (%s)", trunc(r.Baseline, 20), fmtVal(r.BaselineMedian))
			ratio = fmt.Sprintf("%.2f×", r.Ratio)
		}
		goal := "—"
		if r.Goal != "" {
			goal = r.Goal
			if r.Pass != nil {
				goal += map[bool]string{true: " ✓", false: " ✗"}[*r.Pass]
			}
		}
		fmt.Printf("%-3s %-52s %-34s %-10s %10s–%-10s %-6s %-30s %8s  %s\n", r.Workload, trunc(r.Metric, 52), trunc(r.System+" "+r.Config, 34),
			fmtVal(r.Median), fmtVal(r.Min), fmtVal(r.Max), r.Unit, base, ratio, goal)
	}
	printTiming(rep)
	for _, n := range rep.Extra {
		fmt.Printf("note: %s: %s\n", strings.ToUpper(n.Workload), n.Note)
	}
}

func printTiming(rep *report) {
	for _, t := range rep.Timing {
		fmt.Printf("note: %s took %.0f s; %s\n", strings.ToUpper(t.Workload), t.Seconds, t.cpuShares)
	}
}

func trunc(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func fmtVal(v float64) string {
	switch {
	case v == 0:
		return "0"
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// pct is the nearest-rank p-th percentile (0 < p ≤ 100) of v (sorted here).
func pct(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	if !sort.Float64sAreSorted(v) {
		sort.Float64s(v)
	}
	k := int(math.Ceil(p/100*float64(len(v)))) - 1
	return v[min(max(k, 0), len(v)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// poolOf opens another pool on the database of p with n connections.
func poolOf(ctx context.Context, p *pgxpool.Pool, n int) (*pgxpool.Pool, error) {
	cfg := p.Config().Copy()
	cfg.MaxConns = int32(n)
	return pgxpool.NewWithConfig(ctx, cfg)
}

// sizes picks the quick or the full value.
func (e *workloadEnv) size(full, quick int) int {
	if e.o.quick {
		return quick
	}
	return full
}
