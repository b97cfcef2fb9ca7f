// Package authtest fills the console's own tables for other rooms' tests
// (the prune subcommand's), so no test outside internal/auth writes SQL
// against them.
package authtest

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/db"
)

// Refusals records n anonymous refusals made age ago, as the refusal log
// keeps them (auth.Refusals.Record stamps the database's now()).
func Refusals(t testing.TB, q db.Querier, n int, age time.Duration) {
	t.Helper()
	if _, err := q.Exec(context.Background(), `
		INSERT INTO console_refusal (refused_at, route, reason, ip, request_id)
		SELECT now() - $2::interval, 'POST /logout', 'cross_origin', '192.0.2.1', 'authtest'
		  FROM generate_series(1, $1) g`, n, age); err != nil {
		t.Fatalf("authtest: %d refusals: %v", n, err)
	}
}
