// Package dbtest gives every test its own fresh, migrated database, cloned
// from a template, so tests run with t.Parallel() against real PostgreSQL.
//
// The server is TEST_DATABASE_URL (default: the local PostgreSQL on
// 127.0.0.1:5432). When nothing answers there, a throwaway cluster is started
// from the PostgreSQL server binaries on the machine and removed when the test
// binary exits (call dbtest.Main from TestMain). No server and no binaries is
// a test failure that names what to install — never a silent skip.
package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db"
)

// DefaultURL is used when TEST_DATABASE_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

var (
	once     sync.Once
	adminURL string // a maintenance database on the server in use
	template string // name of the migrated template database
	setupErr error
	cluster  *db.Cluster
)

// Main runs the tests and removes a throwaway cluster if one was started.
// Use it from TestMain: func TestMain(m *testing.M) { dbtest.Main(m) }.
func Main(m *testing.M) {
	code := m.Run()
	if cluster != nil {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "dbtest: stop throwaway cluster:", err)
		}
	}
	os.Exit(code)
}

// Config returns a pool configuration for a fresh, migrated database that is
// dropped when the test ends.
func Config(t testing.TB) *pgxpool.Config {
	t.Helper()
	return create(t, "")
}

// EmptyURL returns the URL of a fresh database with no schema at all (for
// testing migrations themselves), dropped when the test ends.
func EmptyURL(t testing.TB) string {
	t.Helper()
	return urlOf(create(t, "template0"))
}

func create(t testing.TB, from string) *pgxpool.Config {
	t.Helper()
	once.Do(setup)
	if setupErr != nil {
		t.Fatalf("dbtest: %v", setupErr)
	}
	if from == "" {
		from = template
	}
	ctx := context.Background()
	name := "sluice_t_" + randomHex(8)
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatalf("dbtest: connect: %v", err)
	}
	defer admin.Close(ctx)
	// Concurrent clones of one template can collide for a moment; retry.
	for attempt := 0; ; attempt++ {
		_, err = admin.Exec(ctx, fmt.Sprintf(`CREATE DATABASE %s TEMPLATE %s`, name, from))
		if err == nil || db.Code(err) != db.CodeObjectInUse || attempt == 50 {
			break
		}
		time.Sleep(time.Duration(20+attempt*10) * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("dbtest: create database: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), adminURL)
		if err != nil {
			t.Errorf("dbtest: drop %s: %v", name, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, name)); err != nil {
			t.Errorf("dbtest: drop %s: %v", name, err)
		}
	})
	cfg, err := pgxpool.ParseConfig(adminURL)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	cfg.ConnConfig.Database = name
	cfg.MaxConns = 20
	return cfg
}

// URL returns the connection URL of a fresh, migrated database (for code
// under test that opens its own pool, such as a subcommand's Main).
func URL(t testing.TB) string {
	t.Helper()
	return urlOf(Config(t))
}

// urlOf writes cfg back as a URL for code that opens its own pool. It keeps
// the password: a TEST_DATABASE_URL that needs one must work for subcommand
// tests too, not only for pools made from the parsed config.
func urlOf(cfg *pgxpool.Config) string {
	c := cfg.ConnConfig
	u := url.URL{Scheme: "postgres", Path: "/" + c.Database}
	if c.Password != "" {
		u.User = url.UserPassword(c.User, c.Password)
	} else {
		u.User = url.User(c.User)
	}
	q := url.Values{"sslmode": {"disable"}}
	if strings.HasPrefix(c.Host, "/") {
		// A Unix socket folder cannot stand in the authority part.
		q.Set("host", c.Host)
		q.Set("port", strconv.Itoa(int(c.Port)))
	} else {
		u.Host = net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port)))
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// New returns a pool on a fresh, migrated database, closed when the test ends.
func New(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := db.OpenConfig(context.Background(), Config(t))
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// AppRole returns a pool on pool's database connected as a fresh login
// role set up by db.Grant, the way the services run in production: it owns
// nothing and may only append to and read the audit trail and the ledger.
// The role is dropped when the test ends.
func AppRole(t testing.TB, pool *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	name, password := "sluice_app_"+randomHex(6), randomHex(16)
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatalf("dbtest: connect: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD '%s'`, name, password)); err != nil {
		t.Fatalf("dbtest: create role: %v", err)
	}
	cfg := pool.Config().Copy()
	cfg.ConnConfig.User, cfg.ConnConfig.Password = name, password
	var app *pgxpool.Pool
	t.Cleanup(func() {
		if app != nil {
			app.Close()
		}
		// Privileges in the test database (and its default privileges)
		// go first: a role that holds any cannot be dropped.
		ctx := context.Background()
		if _, err := pool.Exec(ctx, `DROP OWNED BY `+name); err != nil {
			t.Errorf("dbtest: drop owned by %s: %v", name, err)
		}
		c, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			t.Errorf("dbtest: drop role %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, `DROP ROLE IF EXISTS `+name); err != nil {
			t.Errorf("dbtest: drop role %s: %v", name, err)
		}
	})
	if _, err := db.Grant(ctx, pool, name); err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	if app, err = db.OpenConfig(ctx, cfg); err != nil {
		t.Fatalf("dbtest: connect as %s: %v", name, err)
	}
	return app
}

func setup() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		url = DefaultURL
	}
	if err := ping(ctx, url); err != nil {
		c, cerr := db.StartCluster(ctx)
		if cerr != nil {
			setupErr = fmt.Errorf("no PostgreSQL answers at %s (%v), and no throwaway cluster could be started: %w", redact(url), err, cerr)
			return
		}
		cluster = c
		url = c.URL()
	}
	adminURL = url
	template, setupErr = ensureTemplate(ctx, url)
}

func ping(ctx context.Context, url string) error {
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := pgx.Connect(pctx, url)
	if err != nil {
		return err
	}
	return c.Close(ctx)
}

// ensureTemplate creates (once per schema version, shared by all test
// processes) a database with every migration applied. Its name carries a hash
// of the migration files, so a changed schema gets a new template.
func ensureTemplate(ctx context.Context, url string) (string, error) {
	name := "sluice_tmpl_" + db.MigrationsHash()[:16]
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", err
	}
	defer admin.Close(ctx)
	// Serialize template creation across test binaries running in parallel.
	if _, err := admin.Exec(ctx, `SELECT pg_advisory_lock(7243001)`); err != nil {
		return "", fmt.Errorf("lock: %w", err)
	}
	defer admin.Exec(context.Background(), `SELECT pg_advisory_unlock(7243001)`)
	var ready bool
	err = admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1 AND datistemplate)`, name).Scan(&ready)
	if err != nil {
		return "", err
	}
	if ready {
		return name, nil
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, name)); err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf(`CREATE DATABASE %s`, name)); err != nil {
		return "", fmt.Errorf("create template: %w", err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return "", err
	}
	cfg.ConnConfig.Database = name
	pool, err := db.OpenConfig(ctx, cfg)
	if err != nil {
		return "", err
	}
	_, err = db.Migrate(ctx, pool)
	pool.Close()
	if err != nil {
		return "", err
	}
	// Only a finished template is marked as one, so a crash mid-way is redone.
	if _, err := admin.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s WITH IS_TEMPLATE true`, name)); err != nil {
		return "", err
	}
	return name, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func redact(url string) string {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return "TEST_DATABASE_URL"
	}
	return fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
}

// Prepared lists the statements prepared on conn's session whose text
// mentions table. pgx's default mode prepares every statement it runs and
// keeps it for the connection, and PostgreSQL may switch a prepared
// statement to a generic plan after five runs; a statement sent with
// db.PlanEachCall is never prepared. A test runs functions on one
// connection (a *pgxpool.Conn is a db.Querier), then asks.
func Prepared(t testing.TB, conn db.Querier, table string) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(),
		`SELECT statement FROM pg_prepared_statements WHERE strpos(statement, $1) > 0 ORDER BY prepare_time`,
		pgx.QueryExecModeSimpleProtocol, table)
	if err != nil {
		t.Fatalf("dbtest: prepared statements: %v", err)
	}
	stmts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("dbtest: prepared statements: %v", err)
	}
	return stmts
}
