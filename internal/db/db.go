// Package db owns the connection pool, the embedded schema migrations and the
// one transaction helper every other package uses.
package db

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Open connects a pool to url and checks that the server answers.
func Open(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	return OpenConfig(ctx, cfg)
}

// applicationNameKey carries the name Open gives its connections.
type applicationNameKey struct{}

// WithApplicationName names the connections Open and OpenConfig make with
// ctx (PostgreSQL's application_name, unless the URL sets one), so that
// pg_stat_activity and the server's log tell a relay's sessions from the
// console's (an outage drill could not aim at one part's sessions).
func WithApplicationName(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, applicationNameKey{}, name)
}

// OpenConfig is Open for a parsed configuration (tests tune pool sizes).
func OpenConfig(ctx context.Context, cfg *pgxpool.Config) (*pgxpool.Pool, error) {
	if name, ok := ctx.Value(applicationNameKey{}).(string); ok && cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = name
	}
	after := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		registerTypes(c.TypeMap())
		if after != nil {
			return after(ctx, c)
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to database %s@%s/%s: %w", cfg.ConnConfig.User, cfg.ConnConfig.Host, cfg.ConnConfig.Database, err)
	}
	return pool, nil
}

// Beginner is what WithTx needs: a pool, a connection or a transaction (for a
// savepoint).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// WithTx runs fn in a transaction and commits when fn returns nil, or rolls
// back otherwise. The rollback uses a context that is not cancelled, so a
// cancelled caller still releases its locks at once. WithTx does not retry:
// on a serialization failure the caller retries the whole unit of work
// (see IsRetryable), never one statement inside an aborted transaction.
func WithTx(ctx context.Context, db Beginner, fn func(tx pgx.Tx) error) (err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if p := recover(); p != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			panic(p)
		}
	}()
	if err := fn(tx); err != nil {
		if rbErr := tx.Rollback(context.WithoutCancel(ctx)); rbErr != nil && !errors.Is(rbErr, pgx.ErrTxClosed) {
			return errors.Join(err, fmt.Errorf("rollback: %w", rbErr))
		}
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// SQLSTATE codes the project reacts to. Errors are recognised by code, never
// by message text.
const (
	CodeUniqueViolation      = "23505"
	CodeCheckViolation       = "23514"
	CodeForeignKeyViolation  = "23503"
	CodeSerializationFailure = "40001"
	CodeDeadlockDetected     = "40P01"
	CodeLockNotAvailable     = "55P03"
	CodeObjectInUse          = "55006"
	CodeInsufficientPriv     = "42501"
	CodeQueryCanceled        = "57014"
)

// Code returns the SQLSTATE of err, or "" when err is not a server error.
func Code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Constraint returns the name of the constraint err violated, or "".
func Constraint(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.ConstraintName
	}
	return ""
}

// IsRetryable reports whether the whole transaction may be retried.
func IsRetryable(err error) bool {
	switch Code(err) {
	case CodeSerializationFailure, CodeDeadlockDetected:
		return true
	}
	return false
}

// OpenCurrent is Open for the subcommands that read or write the product's
// tables: it refuses a database whose schema is not the one this binary
// ships, naming the fix (`console migrate up`).
func OpenCurrent(ctx context.Context, url string) (*pgxpool.Pool, error) {
	pool, err := Open(ctx, url)
	if err != nil {
		return nil, err
	}
	if err := CheckSchema(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// Querier runs statements: a pool, a connection or a transaction. Functions
// that work inside the caller's transaction or on their own take one.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// WithTxV is WithTx for a unit of work that returns a value: the value is
// returned only when the transaction committed.
func WithTxV[T any](ctx context.Context, db Beginner, fn func(tx pgx.Tx) (T, error)) (T, error) {
	var v T
	err := WithTx(ctx, db, func(tx pgx.Tx) error {
		var err error
		v, err = fn(tx)
		return err
	})
	if err != nil {
		var zero T
		return zero, err
	}
	return v, nil
}
