package db

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
)

// Migrations are embedded, append-only and each runs in one transaction: a
// released migration is never edited, a change is a new file. goose records
// version numbers, not file names, so a file may be renamed to say what it
// holds but never renumbered (version 3 was dropped before any release; the
// gap is harmless).
//
//go:embed migrations/*.sql
var migrationFS embed.FS

// ErrSchemaOutOfDate is returned when the database lacks migrations this
// binary ships (or has ones it does not know).
var ErrSchemaOutOfDate = errors.New("database schema is out of date: run `console migrate up`")

// MigrationStatus is one row of `console migrate status`.
type MigrationStatus struct {
	Version int64
	Name    string
	Applied bool
}

func provider(pool *pgxpool.Pool) (*goose.Provider, *sql.DB, error) {
	sqlDB := stdlib.OpenDBFromPool(pool)
	sub, err := fs.Sub(migrationFS, "migrations")
	if err != nil {
		sqlDB.Close()
		return nil, nil, err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, sub)
	if err != nil {
		sqlDB.Close()
		return nil, nil, fmt.Errorf("load migrations: %w", err)
	}
	return p, sqlDB, nil
}

// Migrate applies every pending migration and returns how many ran, then
// re-applies the grants of every application role `console db grant`
// recorded, so new tables are usable by the services and the append-only
// ones stay INSERT and SELECT only. Run it as the role that owns the
// tables. Concurrent callers are safe: goose takes a session lock.
func Migrate(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	p, sqlDB, err := provider(pool)
	if err != nil {
		return 0, err
	}
	defer sqlDB.Close()
	res, err := p.Up(ctx)
	if err != nil {
		return len(res), fmt.Errorf("migrate: %w", err)
	}
	if _, err := regrant(ctx, pool); err != nil {
		return len(res), fmt.Errorf("migrate: re-apply application role grants: %w", err)
	}
	return len(res), nil
}

// Status lists every known migration and whether it is applied.
func Status(ctx context.Context, pool *pgxpool.Pool) ([]MigrationStatus, error) {
	p, sqlDB, err := provider(pool)
	if err != nil {
		return nil, err
	}
	defer sqlDB.Close()
	st, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migration status: %w", err)
	}
	out := make([]MigrationStatus, 0, len(st))
	for _, s := range st {
		out = append(out, MigrationStatus{
			Version: s.Source.Version,
			Name:    s.Source.Path,
			Applied: s.State == goose.StateApplied,
		})
	}
	return out, nil
}

// LatestVersion is the newest migration this binary ships.
func LatestVersion() int64 {
	entries, _ := fs.Glob(migrationFS, "migrations/*.sql")
	var latest int64
	for _, e := range entries {
		v, err := goose.NumericComponent(e)
		if err == nil && v > latest {
			latest = v
		}
	}
	return latest
}

// SchemaVersion is the newest migration applied to the database (0 for none).
func SchemaVersion(ctx context.Context, pool RowQuerier) (int64, error) {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('goose_db_version') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM goose_db_version WHERE is_applied`).Scan(&v); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v, nil
}

// CheckSchema refuses a database whose schema is not exactly what this binary
// ships. Every long-running subcommand calls it at start-up, and /readyz too.
func CheckSchema(ctx context.Context, pool RowQuerier) error {
	have, err := SchemaVersion(ctx, pool)
	if err != nil {
		return err
	}
	if want := LatestVersion(); have != want {
		return fmt.Errorf("%w (database at version %d, binary needs %d)", ErrSchemaOutOfDate, have, want)
	}
	return nil
}

// MigrationsHash is a hex digest of every embedded migration, so test
// templates are rebuilt whenever the schema changes.
func MigrationsHash() string {
	h := sha256.New()
	entries, _ := fs.Glob(migrationFS, "migrations/*.sql")
	for _, e := range entries {
		b, _ := migrationFS.ReadFile(e)
		h.Write([]byte(e))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Ready reports whether the database answers within the context's deadline
// and carries the schema this binary ships: what every /readyz answers.
//
// It takes a connection of the pool for a moment; when none frees up in
// time (every one taken by requests waiting on a lock, say), it asks on a
// connection of its own rather than queue behind them: the database
// answers, so the process is ready. Queued, /readyz timed out and said
// "database unreachable" through a 30-second lock an outage drill held,
// which would take every replica out of its load balancer at once. One
// such connection at a time per process: probes, or anyone calling
// /readyz, cannot open more.
func Ready(ctx context.Context, pool *pgxpool.Pool) error {
	actx, cancel := context.WithTimeout(ctx, readyAcquire)
	conn, err := pool.Acquire(actx)
	cancel()
	if err == nil {
		defer conn.Release()
		if err := conn.Ping(ctx); err != nil {
			return fmt.Errorf("database unreachable: %w", err)
		}
		return CheckSchema(ctx, conn)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("database unreachable: %w", err)
	}
	slot, _ := readyOwn.LoadOrStore(pool, make(chan struct{}, 1))
	sem := slot.(chan struct{})
	select {
	case sem <- struct{}{}:
		defer func() { <-sem }()
	case <-ctx.Done():
		return fmt.Errorf("database unreachable: %w", ctx.Err())
	}
	own, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		return fmt.Errorf("database unreachable: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = own.Close(cctx)
	}()
	return CheckSchema(ctx, own)
}

// readyAcquire is how long Ready waits for a connection of the pool before
// it asks on one of its own; readyOwn lets one Ready at a time per pool do
// so (a process with two pools, the demo's, checks each on its own).
const readyAcquire = 300 * time.Millisecond

var readyOwn sync.Map // *pgxpool.Pool → chan struct{} (a slot)
