package db

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
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
	dest := make([]any, len(reads)+1)
	dest[0] = &now
	raw := make([]*string, len(reads))
	for i := range reads {
		dest[i+1] = &raw[i]
	}
	if err := q.QueryRow(ctx, sql, args...).Scan(dest...); err != nil {
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
