package main

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// stmtTrace records every statement a pool sends: when it started, how
// long it took and on which backend (R2's -r2-trace: where an event's
// latency went, next to the relays' claims, marks and the notifier).
type stmtTrace struct {
	mu    sync.Mutex
	stmts []tracedStmt
}

func (t *stmtTrace) reset() {
	t.mu.Lock()
	t.stmts = nil
	t.mu.Unlock()
}

type tracedStmt struct {
	start time.Time
	dur   time.Duration
	pid   uint32
	what  string
	err   bool
}

type stmtStartKey struct{}

type stmtStart struct {
	at   time.Time
	what string
}

func (t *stmtTrace) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, stmtStartKey{}, stmtStart{at: time.Now(), what: stmtLabel(d.SQL)})
}

func (t *stmtTrace) TraceQueryEnd(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryEndData) {
	s, ok := ctx.Value(stmtStartKey{}).(stmtStart)
	if !ok {
		return
	}
	end := time.Now()
	t.mu.Lock()
	t.stmts = append(t.stmts, tracedStmt{start: s.at, dur: end.Sub(s.at), pid: c.PgConn().PID(), what: s.what, err: d.Err != nil})
	t.mu.Unlock()
}

// TraceBatchStart and the rest record a batch (the claim's BEGIN, lock and
// floor) as one statement.
func (t *stmtTrace) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return context.WithValue(ctx, stmtStartKey{}, stmtStart{at: time.Now(), what: "batch"})
}
func (t *stmtTrace) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (t *stmtTrace) TraceBatchEnd(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchEndData) {
	t.TraceQueryEnd(ctx, c, pgx.TraceQueryEndData{Err: d.Err})
}

// r2TraceRuns numbers the traced runs of each rate.
var r2TraceRuns = map[int]int{}

// tracedPool is a pool like p of n connections whose statements t records.
func tracedPool(ctx context.Context, p *pgxpool.Pool, n int, t *stmtTrace) (*pgxpool.Pool, error) {
	cfg := p.Config().Copy()
	cfg.MaxConns = int32(n)
	cfg.ConnConfig.Tracer = t
	return pgxpool.NewWithConfig(ctx, cfg)
}

// stmtLabel is the first words of a statement, whitespace collapsed.
func stmtLabel(sql string) string {
	s := strings.Join(strings.Fields(sql), " ")
	if len(s) > 60 {
		s = s[:60]
	}
	return strings.ReplaceAll(s, ",", ";")
}

// writeR2Trace writes one run's events (commit time after start, latency,
// and in the last column how old the event's id was at its commit) and
// statements, all in ms, as CSV. An event whose id is older at its commit
// than the relay's lateCommit can lie below a relay's cursor, and then waits
// for a walk from the lowest id (outbox.claimCursor).
func writeR2Trace(file string, start time.Time, commits map[string]time.Time, sink *probeSink, traces ...*stmtTrace) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "kind,start_ms,ms,backend,what")
	type ev struct{ at, lat, age float64 }
	var evs []ev
	for id, c := range commits {
		if a, ok := sink.arrived(id); ok {
			evs = append(evs, ev{ms(c.Sub(start)), ms(a.Sub(c)), ms(c.Sub(v7Time(id)))})
		}
	}
	slices.SortFunc(evs, func(a, b ev) int { return cmp.Compare(a.at, b.at) })
	for _, e := range evs {
		fmt.Fprintf(w, "event,%.3f,%.3f,,%.1f\n", e.at, e.lat, e.age)
	}
	for _, t := range traces {
		t.mu.Lock()
		for _, s := range t.stmts {
			what := s.what
			if s.err {
				what = "ERROR " + what
			}
			fmt.Fprintf(w, "stmt,%.3f,%.3f,%d,%s\n", ms(s.start.Sub(start)), ms(s.dur), s.pid, what)
		}
		t.mu.Unlock()
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// v7Time is when a UUIDv7 (in its text form) was made, to the millisecond:
// its first 48 bits. Anything else reads as the zero time.
func v7Time(id string) time.Time {
	u, err := uuid.Parse(id)
	if err != nil || u.Version() != 7 {
		return time.Time{}
	}
	var ms int64
	for _, b := range u[:6] {
		ms = ms<<8 | int64(b)
	}
	return time.UnixMilli(ms)
}
