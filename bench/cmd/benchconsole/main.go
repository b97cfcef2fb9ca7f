// Command benchconsole runs one console process (the real web.App, with the
// development OIDC provider) for the websocket fan-out workload (W1) of
// bench/cmd/benchrun. It prints "READY <base URL>" once it listens, then
// answers each "stats" line on stdin with one JSON line: snapshot
// statements and feed steps so far, heap and RSS after a GC, connected
// websockets. It stops when stdin closes.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/demo/devoidc"
	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/web"
)

// counting counts the statements of the snapshot path.
type counting struct {
	q live.Querier
	n atomic.Int64
}

func (c *counting) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.n.Add(1)
	return c.q.QueryRow(ctx, sql, args...)
}

// SendBatch counts a batch as one: the snapshot goes with its plan setting
// in one round trip (db.ReadAllGeneric).
func (c *counting) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	c.n.Add(1)
	return c.q.SendBatch(ctx, b)
}

func main() {
	url := flag.String("db", "", "database URL (migrated)")
	tick := flag.Duration("tick", 0, "live snapshot interval (0: the console's default)")
	flag.Parse()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool, err := pgxpool.New(ctx, *url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	idp, err := devoidc.Start(ctx, devoidc.Config{Addr: "127.0.0.1:0", ClientID: "console", ClientSecret: "console-secret",
		RedirectURIs: []string{base + "/auth/callback"}, PostLogoutURIs: []string{base + "/signed-out"}})
	if err != nil {
		log.Fatal(err)
	}
	defer idp.Close()
	rm, err := auth.ParseRoleMap(devoidc.DemoRoleMap)
	if err != nil {
		log.Fatal(err)
	}
	counter := &counting{q: pool}
	app, err := web.New(ctx, web.Config{PublicURL: base, OIDCIssuer: idp.Issuer(), OIDCClientID: "console",
		OIDCClientSecret: "console-secret", RolesClaim: "groups", RoleMap: rm, Tick: *tick},
		web.Deps{Pool: pool, Listener: ln, SnapshotQuerier: counter})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx) }()
	fmt.Printf("READY %s\n", base)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() != "stats" {
			continue
		}
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		steps, _ := app.Feed().Stats()
		b, _ := json.Marshal(map[string]any{
			"at": time.Now(), "statements": counter.n.Load(), "steps": steps, "clients": app.Feed().Clients(),
			"heap_inuse": m.HeapInuse, "stack_inuse": m.StackInuse, "rss": rss(), "goroutines": runtime.NumGoroutine(),
		})
		fmt.Println(string(b))
	}
	cancel()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
}

func rss() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	f := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(b)
	if f == nil {
		return 0
	}
	kb, _ := strconv.ParseInt(string(f[1]), 10, 64)
	return kb << 10
}
