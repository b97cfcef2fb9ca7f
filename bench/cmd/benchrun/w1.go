package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// W1 websocket fan-out: one console process (bench/cmd/benchconsole: the
// real web.App with the development OIDC provider), N websocket clients of
// the dashboard in this process. A change is one outbox event committed
// here, followed by the product's Notifier poke (the console's feed listens
// on the outbox channel); its latency for a client is the arrival of the
// first fragment showing the new backlog number minus the commit. Baseline
// in the same run: one client. Sessions are written straight into
// console_session (a random cookie value, its sha256 stored, as a login
// would), eight sockets per session (the console's default per-session cap),
// because signing in thousands of times through the provider is not what is
// measured.

func init() {
	register(70, "w1", runW1)
	flag.StringVar(&benchconsoleBin, "benchconsole", "", "W1: benchconsole binary (default: go build ./cmd/benchconsole into a temporary directory)")
}

var benchconsoleBin string

var backlogFrag = regexp.MustCompile(`data-testid="backlog">([^<]*)<`)

func buildTool(ctx context.Context, bin *string, pkg string) (func(), error) {
	if *bin != "" {
		return func() {}, nil
	}
	dir, err := os.MkdirTemp("", "sluice-bench-tool-")
	if err != nil {
		return nil, err
	}
	*bin = filepath.Join(dir, filepath.Base(pkg))
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", *bin, pkg).CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("build %s (run from bench/): %w: %s", pkg, err, out)
	}
	return func() { os.RemoveAll(dir); *bin = "" }, nil
}

type consoleProc struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	base string
	mu   sync.Mutex
}

func (c *consoleProc) read() (map[string]any, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := io.WriteString(c.in, "stats\n"); err != nil {
		return nil, err
	}
	if !c.out.Scan() {
		return nil, fmt.Errorf("console stopped: %v", c.out.Err())
	}
	var m map[string]any
	return m, json.Unmarshal(c.out.Bytes(), &m)
}

func num(m map[string]any, k string) float64 { v, _ := m[k].(float64); return v }

func runW1(ctx context.Context, e *workloadEnv) error {
	cleanup, err := buildTool(ctx, &benchconsoleBin, "./cmd/benchconsole")
	if err != nil {
		return err
	}
	defer cleanup()
	counts := []int{1, 1000, 5000}
	if e.o.quick {
		counts = []int{1, 1000}
	}
	changes := e.size(20, 8)
	pool, err := e.newDB("w1")
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrateSluice(ctx, pool); err != nil {
		return err
	}
	sessions := (slices.Max(counts) + 7) / 8
	tokens := make([]string, sessions)
	for i := range tokens {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		tokens[i] = base64.RawURLEncoding.EncodeToString(b)
		secret := make([]byte, 32)
		_, _ = rand.Read(secret)
		if _, err := pool.Exec(ctx, `
			INSERT INTO console_session (id_hash, issuer, subject, name, roles, auth_time, created_at, last_seen_at,
				expires_at, csrf_secret, id_token_hint, refresh_token, roles_checked_at)
			VALUES ($1, 'bench', $2, 'Bench', '{viewer}', now(), now(), now(), now() + interval '12 hours', $3, '', '', now())`,
			auth.HashToken(tokens[i]), fmt.Sprintf("bench-%d", i), secret); err != nil {
			return fmt.Errorf("session: %w", err)
		}
	}
	cmd := exec.CommandContext(ctx, benchconsoleBin, "-db", pool.Config().ConnString())
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = io.Discard // the console's request log
	if err := cmd.Start(); err != nil {
		return err
	}
	cp := &consoleProc{cmd: cmd, in: in, out: bufio.NewScanner(outp)}
	defer func() { in.Close(); _ = cmd.Wait() }()
	if !cp.out.Scan() || !strings.HasPrefix(cp.out.Text(), "READY ") {
		return fmt.Errorf("console did not start: %q", cp.out.Text())
	}
	cp.base = strings.TrimPrefix(cp.out.Text(), "READY ")
	notifier := outbox.NewNotifier(pool, 0, nil)
	nctx, ncancel := context.WithCancel(ctx)
	defer ncancel()
	go func() { _ = notifier.Run(nctx) }()

	backlog := 0
	var base *wlResult
	for _, n := range counts {
		time.Sleep(time.Second)
		idle, err := cp.read()
		if err != nil {
			return err
		}
		clients, err := w1Connect(ctx, cp.base, tokens, n)
		if err != nil {
			return err
		}
		if err := waitFor(ctx, func() (bool, error) {
			m, err := cp.read()
			return err == nil && int(num(m, "clients")) >= n, err
		}); err != nil {
			return err
		}
		time.Sleep(time.Second)
		before, err := cp.read()
		if err != nil {
			return err
		}
		var lat []float64
		missed := 0
		for range changes {
			backlog++
			var committed time.Time
			if err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
				_, err := outbox.Insert(ctx, tx, outbox.Event{AggregateType: "bench", AggregateID: "w1", Topic: "payments",
					EventType: "bench.changed.v1", Payload: payload})
				return err
			}); err != nil {
				return err
			}
			committed = time.Now()
			notifier.Poke()
			deadline := committed.Add(5 * time.Second)
			for _, c := range clients {
				at, ok := c.waitFor(backlog, deadline)
				if !ok {
					missed++
					continue
				}
				lat = append(lat, ms(at.Sub(committed)))
			}
			time.Sleep(time.Until(committed.Add(700 * time.Millisecond)))
		}
		after, err := cp.read()
		if err != nil {
			return err
		}
		for _, c := range clients {
			c.conn.Close()
		}
		// The next round reuses the sessions: wait until the console has let
		// these sockets go (8 per session at most).
		if err := waitFor(ctx, func() (bool, error) {
			m, err := cp.read()
			return err == nil && num(m, "clients") == 0, err
		}); err != nil {
			return err
		}
		slices.Sort(lat)
		steps := num(after, "steps") - num(before, "steps")
		stmts := num(after, "statements") - num(before, "statements")
		heap := (num(before, "heap_inuse") + num(before, "stack_inuse") - num(idle, "heap_inuse") - num(idle, "stack_inuse")) / float64(n)
		rss := (num(before, "rss") - num(idle, "rss")) / float64(n)
		fmt.Printf("  %d clients: change→client p50 %.0f ms p99 %.0f ms max %.0f ms (%d changes, %d client-changes missed), %0.f statements over %.0f feed steps, heap+stack %.1f KiB/client, RSS %.1f KiB/client\n",
			n, pct(lat, 50), pct(lat, 99), lat[len(lat)-1], changes, missed, stmts, steps, heap/1024, rss/1024)
		cfg := fmt.Sprintf("%d clients", n)
		r := &wlResult{Workload: "W1", Metric: fmt.Sprintf("change→client p99, %d clients (p50 %s ms)", n, fmtVal(pct(lat, 50))), System: "console", Config: cfg, Unit: "ms",
			Runs: []float64{pct(lat, 99)}, Details: map[string]any{"p50_ms": pct(lat, 50), "max_ms": lat[len(lat)-1], "missed": missed, "changes": changes}}
		perStep := &wlResult{Workload: "W1", Metric: fmt.Sprintf("snapshot statements per feed step, %d clients", n), System: "console", Config: cfg, Unit: "stmts",
			Runs: []float64{stmts / max(steps, 1)}, Details: map[string]any{"statements": stmts, "steps": steps}}
		if n == 1 {
			base = r
			e.add(r)
			e.add(perStep)
			continue
		}
		e.add(r).against(base)
		r.goal("p99 ≤ 250 ms, none missed", r.Median <= 250 && missed == 0)
		e.add(perStep).goal("1 per step", perStep.Median == 1)
		mem := &wlResult{Workload: "W1", Metric: fmt.Sprintf("console heap+stack per client, %d clients", n), System: "console", Config: cfg, Unit: "KiB",
			Runs: []float64{heap / 1024}, Details: map[string]any{"rss_kib_per_client": rss / 1024, "goroutines": num(before, "goroutines")}}
		e.add(mem)
	}
	e.note("w1", "one console process (bench/cmd/benchconsole: web.App, default tick 1 s, feed woken by NOTIFY, at most every 250 ms), clients in the bench process (gorilla/websocket, cookie + Origin as a browser sends them); sessions inserted into console_session, 8 sockets each; %d changes per client count, 700 ms apart; memory per client = (heap in use + stacks after GC with the clients connected − the same before they connected) ÷ clients; the console runs as the database owner, not the app role", changes)
	return nil
}

type w1Client struct {
	conn *websocket.Conn
	mu   sync.Mutex
	cond *sync.Cond
	seen map[int]time.Time // backlog value → first arrival
	max  int
}

// waitFor returns when the client first showed a backlog ≥ v.
func (c *w1Client) waitFor(v int, deadline time.Time) (time.Time, bool) {
	timer := time.AfterFunc(time.Until(deadline), func() { c.mu.Lock(); c.cond.Broadcast(); c.mu.Unlock() })
	defer timer.Stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.max < v && time.Now().Before(deadline) {
		c.cond.Wait()
	}
	var first time.Time
	for k, t := range c.seen {
		if k >= v && (first.IsZero() || t.Before(first)) {
			first = t
		}
	}
	return first, !first.IsZero()
}

func w1Connect(ctx context.Context, base string, tokens []string, n int) ([]*w1Client, error) {
	u := "ws" + strings.TrimPrefix(base, "http") + "/ws"
	clients := make([]*w1Client, n)
	errc := make(chan error, n)
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			hdr := http.Header{}
			hdr.Set("Origin", base)
			hdr.Set("Cookie", "sluice_session="+tokens[i/8])
			d := websocket.Dialer{HandshakeTimeout: 30 * time.Second}
			conn, resp, err := d.DialContext(ctx, u, hdr)
			if err != nil {
				if resp != nil {
					err = fmt.Errorf("%w (HTTP %d)", err, resp.StatusCode)
				}
				errc <- err
				return
			}
			c := &w1Client{conn: conn, seen: map[int]time.Time{}}
			c.cond = sync.NewCond(&c.mu)
			clients[i] = c
			go func() {
				for {
					_, msg, err := conn.ReadMessage()
					if err != nil {
						return
					}
					now := time.Now()
					for _, m := range backlogFrag.FindAllSubmatch(msg, -1) {
						v, err := strconv.Atoi(strings.Map(func(r rune) rune {
							if r >= '0' && r <= '9' {
								return r
							}
							return -1
						}, string(m[1])))
						if err != nil {
							continue
						}
						c.mu.Lock()
						if _, ok := c.seen[v]; !ok {
							c.seen[v] = now
						}
						c.max = max(c.max, v)
						c.cond.Broadcast()
						c.mu.Unlock()
					}
				}
			}()
		})
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		for _, c := range clients {
			if c != nil {
				c.conn.Close()
			}
		}
		return nil, fmt.Errorf("connect: %w", err)
	}
	return clients, nil
}
