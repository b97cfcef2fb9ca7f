package demo

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// syncBuffer is a bytes.Buffer safe for the demo's writer goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// The demo is what a newcomer runs first: it must come alive (events written,
// published, consumed once), print its status, and leave nothing behind.
func TestDemoComesAliveAndCleansUp(t *testing.T) {
	t.Parallel()
	server := dbtest.URL(t)
	cfg, err := config.ParseDemo([]string{
		"--database-url", server,
		"--console-addr", "127.0.0.1:0", "--payments-addr", "127.0.0.1:0", "--provider-addr", "127.0.0.1:0",
		"--event-rate", "100", "--status-every", "200ms",
	}, config.MapLookup(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	ctx := context.Background()
	d, err := Start(ctx, cfg, &out, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	demoDB := d.db.name
	runCtx, stop := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(runCtx) }()

	deadline := time.Now().Add(60 * time.Second)
	for d.consumer.Counts().Applied < 100 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	applied := d.consumer.Counts().Applied
	for d.consumer.Counts().Duplicates == 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	dups := d.consumer.Counts().Duplicates
	for !strings.Contains(out.String(), "published") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	// The console is up and its door is shut to anonymous visitors.
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	health, herr := client.Get(d.ConsoleURL + "/healthz")
	req, _ := http.NewRequest(http.MethodGet, d.ConsoleURL+"/", nil)
	req.Header.Set("Accept", "text/html")
	home, perr := client.Do(req)
	stop()
	if herr != nil || health.StatusCode != http.StatusOK {
		t.Errorf("console /healthz: %v %v", herr, health)
	}
	if perr != nil || home.StatusCode != http.StatusSeeOther && home.StatusCode != http.StatusFound || !strings.HasPrefix(home.Header.Get("Location"), "/login") {
		t.Errorf("anonymous GET / should redirect to /login: %v %+v", perr, home)
	}
	if !strings.Contains(out.String(), "support") || !strings.Contains(out.String(), d.ConsoleURL) {
		t.Errorf("the banner should name the console URL and the demo users:\n%s", out.String())
	}
	if err := <-runErr; err != nil {
		t.Errorf("Run: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if applied < 100 {
		t.Fatalf("consumer applied %d events within 60s, want ≥ 100; output:\n%s", applied, out.String())
	}
	if dups == 0 {
		t.Errorf("the demo's redeliveries never reached the inbox as duplicates")
	}
	if !strings.Contains(out.String(), "outbox: backlog") {
		t.Errorf("no status line in the output:\n%s", out.String())
	}

	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, demoDB).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Errorf("demo database %s still exists after Close", demoDB)
	}
}
