package db_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
)

// TestNamedRewritesAsPgx: a Named statement sends the same SQL and the same
// values, in the same order, as pgx.NamedArgs would for that call — with
// names repeated, names in literals, comments and quoted identifiers (which
// are not parameters), casts, and a name the call leaves out (NULL).
func TestNamedRewritesAsPgx(t *testing.T) {
	cases := []string{
		`SELECT @a, @b, @a`,
		`SELECT @b::bigint, @a::numeric WHERE x = @b`,
		`SELECT '@not_a_param', "@neither", @real -- @comment
		 /* @block */ FROM t WHERE e = 'it''s @x' AND @real2 > 0`,
		`WITH t AS (SELECT @now AS now) SELECT jsonb_set(@payload::jsonb, '{at}', to_jsonb(@now)) FROM t WHERE k = @missing`,
		`SELECT 1`,
		`SELECT @ğüşiöç_1, @_x`,
	}
	args := pgx.NamedArgs{"a": 1, "b": "two", "real": 3.0, "real2": int64(4), "now": "2026-12-04", "payload": []byte(`{}`),
		"ğüşiöç_1": "unicode", "_x": true, "unused": "extra"}
	for _, sql := range cases {
		wantSQL, wantArgs, err := args.RewriteQuery(context.Background(), nil, sql, nil)
		if err != nil {
			t.Fatalf("pgx rewrite of %q: %v", sql, err)
		}
		n := db.NewNamed(sql)
		if n.SQL() != wantSQL {
			t.Errorf("SQL of %q:\n got %q\nwant %q", sql, n.SQL(), wantSQL)
		}
		if got := n.Args(args); !reflect.DeepEqual(got, wantArgs) {
			t.Errorf("args of %q: got %#v, want %#v", sql, got, wantArgs)
		}
	}
}
