package db

import (
	"context"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
)

// Named is a statement written with @name placeholders, rewritten once to
// $n ones. pgx.NamedArgs lexes the whole SQL text on every call to do the
// same; for the payments service's two long statements (reserve and
// settle, a few KB each) that was about a tenth of the service's own CPU
// per payment (bench/README.md, P1). outbox.Insert, every producer's
// statement, is kept the same way. Named keeps pgx's rewriting exactly:
// it is pgx's own rewrite, run once with every name the text could hold,
// and Args orders a call's values by the names it found.
type Named struct {
	sql   string
	names []string // names[i] is the value of $i+1
}

// candidateName matches every @name pgx's lexer can take, and more (names
// inside literals and comments, which pgx skips): a superset, so no name
// pgx finds is left without its marker below.
var candidateName = regexp.MustCompile(`@([\pL_][\pL\pN_]*)`)

// NewNamed rewrites sql; it panics when it cannot (a programming error in a
// constant statement, found by the first test that runs it).
func NewNamed(sql string) Named {
	markers := pgx.NamedArgs{}
	for _, m := range candidateName.FindAllStringSubmatch(sql, -1) {
		markers[m[1]] = m[1]
	}
	positional, args, err := markers.RewriteQuery(context.Background(), nil, sql, nil)
	if err != nil {
		panic(fmt.Sprintf("db: rewrite named statement: %v", err))
	}
	names := make([]string, len(args))
	for i, a := range args {
		name, ok := a.(string)
		if !ok {
			panic(fmt.Sprintf("db: named statement: $%d has no name candidateName found", i+1))
		}
		names[i] = name
	}
	return Named{sql: positional, names: names}
}

// SQL is the statement with $n placeholders.
func (n Named) SQL() string { return n.sql }

// Args are args' values in the statement's $n order. A name args lacks is
// NULL, as with pgx.NamedArgs.
func (n Named) Args(args pgx.NamedArgs) []any {
	out := make([]any, len(n.names))
	for i, name := range n.names {
		out[i] = args[name]
	}
	return out
}
