package demo

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/testkit"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// testConfig is a demo on server's PostgreSQL, every address a free port,
// with the flags given.
func testConfig(t *testing.T, server string, flags ...string) config.Demo {
	t.Helper()
	var cfg config.Demo
	f := config.NewFlags("demo", "", config.MapLookup(nil), &bytes.Buffer{})
	cfg.Register(f)
	if err := f.Parse(append([]string{"--database-url", server,
		"--console-addr", "127.0.0.1:0", "--payments-addr", "127.0.0.1:0", "--provider-addr", "127.0.0.1:0"}, flags...)); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// The demo is what a newcomer runs first: it must come alive (events written,
// published, consumed once), print its status, and leave nothing behind.
func TestDemoComesAliveAndCleansUp(t *testing.T) {
	t.Parallel()
	server := dbtest.URL(t)
	cfg := testConfig(t, server, "--event-rate", "100", "--status-every", "200ms")
	var out testkit.Buffer
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
	tryBannerExample(t, out.String())
	verifyBannerDatabase(t, out.String(), server)
	// The live snapshot's gauges appear with its first step, a moment after
	// the console starts: wait for it rather than race it.
	metrics := scrape(t, d.ConsoleURL+"/metrics")
	for !strings.Contains(metrics, "\nsluice_outbox_oldest_pending_age_seconds") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		metrics = scrape(t, d.ConsoleURL+"/metrics")
	}
	stop()
	// One process, one /metrics: every part's series are on the console's.
	for part, name := range map[string]string{
		"relays": "sluice_outbox_published_total", "consumer": "sluice_inbox_processed_total",
		"payments service": "sluice_payments_total", "payments health": "sluice_payments_unknown",
		"console": "sluice_ws_clients", "live snapshot": "sluice_outbox_oldest_pending_age_seconds",
	} {
		if !strings.Contains(metrics, "\n"+name) {
			t.Errorf("the demo's /metrics lacks the %s' %s", part, name)
		}
	}
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
	} else if !strings.Contains(out.String(), "· stopped; removed the demo database") {
		t.Errorf("Close should say what it removed:\n%s", out.String())
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

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %d %v", url, resp.StatusCode, err)
	}
	return string(body)
}

// bannerCurl finds the payments example the banner prints: URL,
// idempotency key, the demo merchant's API key and body.
var bannerCurl = regexp.MustCompile(`curl -i -X POST (\S+) -H 'Idempotency-Key: ([^']+)' -H 'Authorization: Bearer ([^']+)' \\\n\s+-d '([^']+)'`)

// tryBannerExample runs the banner's curl example twice, as a newcomer
// would: the first answer is a real payment outcome (never a client error),
// the second is the stored answer, replayed.
func tryBannerExample(t *testing.T, banner string) {
	t.Helper()
	m := bannerCurl.FindStringSubmatch(banner)
	if m == nil {
		t.Errorf("the banner has no payments example to try:\n%s", banner)
		return
	}
	post := func() (*http.Response, error) {
		// curl -d sends a form content type; the example must work with it.
		req, err := http.NewRequest(http.MethodPost, m[1], strings.NewReader(m[4]))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Idempotency-Key", m[2])
		req.Header.Set("Authorization", "Bearer "+m[3])
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return resp, err
	}
	first, err := post()
	if err != nil {
		t.Errorf("banner example: %v", err)
		return
	}
	switch first.StatusCode {
	// The provider's faults apply: declined 402, down 502, no answer 202.
	case http.StatusCreated, http.StatusAccepted, http.StatusPaymentRequired, http.StatusBadGateway:
	default:
		t.Errorf("banner example answered %s, want a payment outcome (201, 202, 402 or 502)", first.Status)
		return
	}
	second, err := post()
	if err != nil {
		t.Errorf("banner example, repeated: %v", err)
		return
	}
	if second.StatusCode != first.StatusCode || second.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("banner example repeated: %s, Idempotent-Replayed %q; want %s replayed", second.Status, second.Header.Get("Idempotent-Replayed"), first.Status)
	}
}

// bannerDatabase finds the demo database the banner names.
var bannerDatabase = regexp.MustCompile(`Demo database: (\S+)\n\s+while the demo runs, check its audit chain with: console audit verify --database-url '(\S+)'`)

// verifyBannerDatabase does what the banner suggests: it points the audit
// check at the printed URL (which must hold no password), as `console audit
// verify --database-url` would.
func verifyBannerDatabase(t *testing.T, banner, server string) {
	t.Helper()
	m := bannerDatabase.FindStringSubmatch(banner)
	if m == nil || m[1] != m[2] {
		t.Errorf("the banner names no database URL for `console audit verify`:\n%s", banner)
		return
	}
	c := config.Database{DatabaseURL: m[1]}
	if err := c.Validate(); err != nil {
		t.Errorf("banner database URL: %v", err)
		return
	}
	u, err := url.Parse(m[1])
	if err != nil {
		t.Errorf("banner database URL: %v", err)
		return
	}
	if _, has := u.User.Password(); has {
		t.Errorf("the banner prints a password: %s", m[1])
	}
	// The banner asks for the password as PGPASSWORD; the test gives it
	// back in the URL instead (no os.Setenv in a parallel test).
	if s, err := url.Parse(server); err == nil && s.User != nil {
		if p, has := s.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), p)
		}
	}
	ctx := context.Background()
	pool, err := db.Open(ctx, u.String())
	if err != nil {
		t.Errorf("open the banner's database: %v", err)
		return
	}
	defer pool.Close()
	res, err := audit.Verify(ctx, pool)
	if err != nil || !res.Intact() {
		t.Errorf("audit verify on the banner's database: %+v %v", res, err)
	}
}

func TestWithoutPassword(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://app:s3cret@db.example:5432/sluice_demo_1?sslmode=require": "postgres://app@db.example:5432/sluice_demo_1?sslmode=require",
		"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable":         "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
	} {
		got, hidden := withoutPassword(in)
		if got != want || hidden != (in != want) {
			t.Errorf("withoutPassword(%q) = %q, %v; want %q", in, got, hidden, want)
		}
	}
}

// The demo rides out its database's trouble, as its parts do: an outage
// drill's first restart stopped the whole demo within seconds (the order
// workload and the status line returned the first error they met) and
// removed its database. Here every connection of the demo's database is cut
// again and again for two seconds; the demo goes on, and its parts connect
// under names of their own (application_name), each part with its own pool.
func TestDemoRidesOutCutConnections(t *testing.T) {
	t.Parallel()
	server := dbtest.URL(t)
	cfg := testConfig(t, server, "--event-rate", "100", "--status-every", "100ms")
	var out testkit.Buffer
	ctx := context.Background()
	d, err := Start(ctx, cfg, &out, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(runCtx) }()
	testkit.Eventually(t, "events applied", func() (bool, error) { return d.consumer.Counts().Applied >= 20, nil })

	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	names := map[string]bool{}
	rows, err := conn.Query(ctx, `SELECT DISTINCT application_name FROM pg_stat_activity WHERE datname = $1`, d.db.name)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names[n] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"sluice-demo relay-1", "sluice-demo relay-2", "sluice-demo consumer", "sluice-demo payments", "sluice-demo console", "sluice-demo order workload"} {
		if !names[want] {
			t.Errorf("no connection named %q among %v", want, names)
		}
	}

	cut := 0
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, d.db.name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		cut += n
	}
	if cut == 0 {
		t.Fatal("no connection was cut: the test tried nothing")
	}
	select {
	case err := <-runErr:
		t.Fatalf("the demo stopped after its connections were cut: %v\n%s", err, out.String())
	default:
	}
	after := d.consumer.Counts().Applied
	testkit.Eventually(t, "events applied after the cuts", func() (bool, error) { return d.consumer.Counts().Applied >= after+50, nil })
	select {
	case err := <-runErr:
		t.Fatalf("the demo stopped: %v\n%s", err, out.String())
	default:
	}
	stop()
	if err := <-runErr; err != nil {
		t.Errorf("Run: %v", err)
	}
}
