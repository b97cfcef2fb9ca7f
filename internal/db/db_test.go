package db_test

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func TestFreshDatabaseIsMigratedAndCurrent(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	if err := db.CheckSchema(ctx, pool); err != nil {
		t.Fatalf("fresh database should be current: %v", err)
	}
	st, err := db.Status(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) == 0 {
		t.Fatal("no migrations reported")
	}
	for _, s := range st {
		if !s.Applied {
			t.Errorf("migration %d %s not applied", s.Version, s.Name)
		}
	}
	for _, table := range []string{"outbox_event", "inbox_message", "idempotency_record", "payment", "account",
		"balance_reservation", "ledger_entry", "audit_event", "console_session"} {
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&ok); err != nil || !ok {
			t.Errorf("table %s missing (err %v)", table, err)
		}
	}
}

func TestOutOfDateSchemaIsRefused(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	latest := db.LatestVersion()
	if _, err := pool.Exec(ctx, `DELETE FROM goose_db_version WHERE version_id = $1`, latest); err != nil {
		t.Fatal(err)
	}
	err := db.CheckSchema(ctx, pool)
	if !errors.Is(err, db.ErrSchemaOutOfDate) {
		t.Fatalf("CheckSchema = %v, want ErrSchemaOutOfDate", err)
	}
}

func TestWithTxCommitsOrRollsBack(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	boom := errors.New("boom")
	err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO account (account_id, balance) VALUES (1, 10)`); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("WithTx = %v, want boom", err)
	}
	err = db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO account (account_id, balance) VALUES (2, 10)`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	rows, _ := pool.Query(ctx, `SELECT account_id FROM account ORDER BY 1`)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 || ids[0] != 2 {
		t.Fatalf("accounts = %v, want [2]: the failed transaction must leave nothing", ids)
	}
}

func TestBalanceCheckIsTheLastLineOfDefence(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	_, err := pool.Exec(context.Background(), `INSERT INTO account (account_id, balance) VALUES (1, -1)`)
	if db.Code(err) != db.CodeCheckViolation {
		t.Fatalf("negative balance: err = %v, want check violation", err)
	}
}

// The throwaway cluster is what tests and the demo fall back on when no
// server answers; it must start (as the postgres user when we are root),
// accept connections and leave nothing behind.
func TestThrowawayClusterStartsAndCleansUp(t *testing.T) {
	t.Parallel()
	if _, err := db.FindServerBinaries(); err != nil {
		t.Fatalf("this test needs PostgreSQL server binaries: %v", err)
	}
	ctx := context.Background()
	c, err := db.StartCluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir := c.Dir()
	pool, err := db.Open(ctx, c.URL())
	if err != nil {
		c.Stop()
		t.Fatal(err)
	}
	if _, err := db.Migrate(ctx, pool); err != nil {
		t.Errorf("migrate on throwaway cluster: %v", err)
	}
	pool.Close()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("cluster folder %s still exists after Stop (stat err %v)", dir, err)
	}
}

// Each part names its connections, so pg_stat_activity tells whose session
// holds a lock; a name the URL gives wins.
func TestConnectionsCarryTheirPartsName(t *testing.T) {
	t.Parallel()
	ctx := db.WithApplicationName(context.Background(), "sluice relay")
	for _, c := range []struct{ fromURL, want string }{{"", "sluice relay"}, {"mine", "mine"}} {
		cfg := dbtest.Config(t)
		if c.fromURL != "" {
			cfg.ConnConfig.RuntimeParams["application_name"] = c.fromURL
		}
		pool, err := db.OpenConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		err = pool.QueryRow(ctx, `SHOW application_name`).Scan(&got)
		pool.Close()
		if err != nil || got != c.want {
			t.Errorf("application_name %q (%v), want %q", got, err, c.want)
		}
	}
}

// A pool whose every connection is taken (requests waiting on a lock) is
// still ready while its database answers: Ready asks on a connection of its
// own instead of queueing, and so still tells an unreachable database.
func TestReadyWhileEveryConnectionIsTaken(t *testing.T) {
	t.Parallel()
	cfg := dbtest.Config(t)
	cfg.MaxConns = 1
	// Counted where they are made and closed: a backend outlives its
	// client's close for a moment, so pg_stat_activity counts high.
	var open, peak atomic.Int64
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		n := open.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		return &countedConn{Conn: c, open: &open}, nil
	}
	pool, err := db.OpenConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	held, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.Ready(ctx, pool); err != nil {
		t.Fatalf("a busy pool of a database that answers: %v", err)
	}
	// Many probes at once open one connection of their own at a time, not
	// one each (a review counted 8 backends for 60 probes).
	var wg sync.WaitGroup
	errs := make(chan error, 30)
	for range 30 {
		wg.Go(func() { errs <- db.Ready(ctx, pool) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a probe among many: %v", err)
		}
	}
	if p := peak.Load(); p > 2 {
		t.Fatalf("%d connections open at once for the probes and the held one, want at most 2", p)
	}
	nowhere := dbtest.Config(t)
	nowhere.ConnConfig.Host, nowhere.ConnConfig.Port = "127.0.0.1", 1
	gone, err := pgxpool.NewWithConfig(context.Background(), nowhere)
	if err != nil {
		t.Fatal(err)
	}
	defer gone.Close()
	if err := db.Ready(ctx, gone); err == nil {
		t.Fatal("a database nobody answers for is ready")
	}
}

// countedConn counts itself out of open when closed (once).
type countedConn struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}
