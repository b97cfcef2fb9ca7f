// Package inboxtest makes inbox rows for other rooms' tests (the prune
// subcommand's), so no test outside internal/inbox writes SQL against the
// inbox's tables.
package inboxtest

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/db"
)

// Processed records n message ids of consumer as processed age ago
// (message ids "m1"…"mN").
func Processed(t testing.TB, q db.Querier, consumer string, n int, age time.Duration) {
	t.Helper()
	if _, err := q.Exec(context.Background(), `
		INSERT INTO inbox_message (consumer, message_id, processed_at)
		SELECT $1, 'm' || g, now() - $3::interval FROM generate_series(1, $2) g`, consumer, n, age); err != nil {
		t.Fatalf("inboxtest: processed rows: %v", err)
	}
}

// Effects records n effects of the reference consumer applied age ago.
func Effects(t testing.TB, q db.Querier, consumer string, n int, age time.Duration) {
	t.Helper()
	if _, err := q.Exec(context.Background(), `
		INSERT INTO consume_effect (consumer, event_id, topic, event_type, aggregate_type, aggregate_id, aggregate_seq, applied_at)
		SELECT $1, 'e' || g, 't', 't.v1', 'a', 'x', g, now() - $3::interval FROM generate_series(1, $2) g`, consumer, n, age); err != nil {
		t.Fatalf("inboxtest: effect rows: %v", err)
	}
}
