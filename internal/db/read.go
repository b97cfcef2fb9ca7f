package db

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Read is one room's part of a statement composed from several rooms'
// reads, such as the console's one snapshot per tick. Each room writes the
// SQL for its own tables (STYLE: SQL lives with its owner) as one SELECT-list
// expression, a scalar subquery, so parts combine side by side without
// joins, and scans it itself: every number then has one definition, shared
// by whoever reads it alone or composed.
type Read interface {
	// Expr returns the part's expression; parameters go through args.
	Expr(args *Args) string
	// Scan takes the value the expression produced.
	Scan(src []byte) error
}

// Args numbers the parameters of a composed statement.
type Args []any

// Add appends v and returns its placeholder.
func (a *Args) Add(v any) string {
	*a = append(*a, v)
	return fmt.Sprintf("$%d", len(*a))
}

// Int writes n into a part as a literal, not a parameter: for a LIMIT, whose
// value the plan depends on. ReadAllGeneric's plan is made once for every
// value, and plans LIMIT $n for a tenth of the rows (the dashboard's five
// newest dead letters read by sorting every dead letter rather than from the
// first entries of their index).
func Int(n int) string { return strconv.Itoa(n) }

// RowQuerier runs a statement that returns one row.
type RowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Compose writes reads as one statement, `SELECT now(), r1, r2, …`, each
// part cast to text, and returns it with its arguments (for EXPLAIN in plan
// tests; ReadAll runs it).
func Compose(reads ...Read) (string, Args) {
	var args Args
	exprs := make([]string, 0, len(reads)+1)
	exprs = append(exprs, "now()")
	for _, r := range reads {
		exprs = append(exprs, "("+r.Expr(&args)+")::text")
	}
	return "SELECT " + strings.Join(exprs, ",\n       "), args
}

// ReadAll runs reads as one statement (Compose), so every part sees one
// snapshot of the database, hands each part its value, and returns the
// database's now() for the statement: one clock for every part.
func ReadAll(ctx context.Context, q RowQuerier, reads ...Read) (now time.Time, err error) {
	sql, args := Compose(reads...)
	return scanReads(q.QueryRow(ctx, sql, args...), reads)
}

// BatchSender sends several statements in one round trip: a pool, a
// connection or a transaction.
type BatchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// genericPlanSQL makes the statements after it, up to the end of their
// transaction, run on their prepared statement's generic plan, with neither
// parallel workers nor JIT compilation: a plan made once must not turn,
// on an estimate, into one that starts workers and compiles itself on every
// call (the snapshot's generic plan at 10M events, its "published since"
// part estimated at a third of the table: a parallel scan with JIT, 200 ms
// for a count of a few rows). Sent in the same batch as the statement, the
// settings last until the batch's Sync ends the implicit transaction both
// run in, so the connection goes back to its pool with the server's.
const genericPlanSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
	set_config('max_parallel_workers_per_gather', '0', true), set_config('jit', 'off', true)`

// ReadAllGeneric is ReadAll for a statement run again and again, such as
// the console's snapshot every tick: it runs on the generic plan its
// prepared statement keeps for the connection, planned once rather than on
// every call. PostgreSQL would otherwise plan it anew each time, since a
// parameter compared with a column (the snapshot's "published since") makes
// the generic plan's estimate worse than a custom one's, however alike the
// plans; for the snapshot that planning was 1.4–2.8 ms against 4–9 ms of
// execution (bench/README.md, "The snapshot's plan, made once").
//
// Only for reads whose best plan does not depend on their arguments' values:
// every partial index predicate and every LIMIT written as a literal, never
// a parameter (a generic plan cannot prove a partial index's predicate from
// a parameter, and plans LIMIT $n for a tenth of the rows). A caller's plan
// test checks the generic plan (ExplainGeneric). ANALYZE, and the pool's
// connection lifetime, replace a plan made on statistics gone stale.
//
// It costs one more statement in the same round trip, not another round trip.
// Run on a transaction (q a pgx.Tx), the settings last until that
// transaction ends.
func ReadAllGeneric(ctx context.Context, q BatchSender, reads ...Read) (now time.Time, err error) {
	sql, args := Compose(reads...)
	b := &pgx.Batch{}
	b.Queue(genericPlanSQL)
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
		now, err = scanReads(row, reads)
		return err
	})
	if cerr := q.SendBatch(ctx, b).Close(); err == nil {
		err = cerr
	}
	return now, err
}

// ExplainGeneric returns EXPLAIN's lines for the generic plan of sql, the
// plan ReadAllGeneric runs it on (a plain EXPLAIN with arguments shows a
// custom plan). options are EXPLAIN's, such as "ANALYZE, BUFFERS" or "".
// It runs in a transaction it rolls back, and deallocates the statement it
// prepares (prepared statements outlive transactions).
func ExplainGeneric(ctx context.Context, q Beginner, options, sql string, args ...any) ([]string, error) {
	name := fmt.Sprintf("sluice_explain_generic_%d", explains.Add(1))
	simple := pgx.QueryExecModeSimpleProtocol
	var lines []string
	err := WithTx(ctx, q, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, genericPlanSQL, simple); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "PREPARE "+name+" AS "+sql, simple); err != nil {
			return err
		}
		// EXECUTE takes its arguments as literals, which the simple
		// protocol quotes client-side: a utility statement has no
		// parameters of its own.
		ph := make([]string, len(args))
		for i := range args {
			ph[i] = fmt.Sprintf("$%d", i+1)
		}
		explain := "EXPLAIN "
		if options != "" {
			explain += "(" + options + ") "
		}
		execute := "EXECUTE " + name
		if len(ph) > 0 { // EXECUTE name() is a syntax error
			execute += "(" + strings.Join(ph, ", ") + ")"
		}
		rows, err := tx.Query(ctx, explain+execute, append([]any{simple}, args...)...)
		if err != nil {
			return err
		}
		if lines, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "DEALLOCATE "+name, simple); err != nil {
			return err
		}
		return errRollbackExplain
	})
	if errors.Is(err, errRollbackExplain) {
		err = nil
	}
	return lines, err
}

var (
	explains           atomic.Int64 // names ExplainGeneric's statements apart
	errRollbackExplain = errors.New("db: explain rolls back")
)

// scanReads scans ReadAll's row: the database's now(), then each part.
func scanReads(row pgx.Row, reads []Read) (now time.Time, err error) {
	dest := make([]any, len(reads)+1)
	dest[0] = &now
	raw := make([]*string, len(reads))
	for i := range reads {
		dest[i+1] = &raw[i]
	}
	if err := row.Scan(dest...); err != nil {
		return now, err
	}
	for i, r := range reads {
		var src []byte
		if raw[i] != nil {
			src = []byte(*raw[i])
		}
		if err := r.Scan(src); err != nil {
			return now, err
		}
	}
	return now, nil
}

// ScanJSON is the Scan of a part whose expression builds a JSON value: it
// decodes src into v (a NULL leaves v as it is).
func ScanJSON(src []byte, v any) error {
	if src == nil {
		return nil
	}
	return json.Unmarshal(src, v)
}
