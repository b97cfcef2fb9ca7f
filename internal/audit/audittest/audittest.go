// Package audittest fills the audit trail for other rooms' tests that need
// many rows fast (the export's bounded-memory test), so no test outside
// internal/audit writes SQL against audit_event.
package audittest

import (
	"context"
	"testing"

	"github.com/sluice-dev/sluice/internal/db"
)

// Bulk appends n rows straight into audit_event as its owner, spread over
// the last n seconds. Their hashes are not a valid chain (audit.Verify
// reports the first one): only for tests that read rows, never for tests of
// the chain.
func Bulk(t testing.TB, q db.Querier, n int) {
	t.Helper()
	if _, err := q.Exec(context.Background(), `
		INSERT INTO audit_event (occurred_at, actor_iss, actor_sub, actor_name, actor_roles, action, target_type, target_id,
		                         after, reason, request_id, session_hash, ip, user_agent, outcome, prev_hash, hash)
		SELECT now() - make_interval(secs => $1 - g), 'https://idp.example', 'sub-' || (g % 100), 'user ' || (g % 100), '{operator}',
		       'outbox.retry', 'outbox_event', md5(g::text), '{"status": "pending"}', 'bulk row ' || g, md5('r' || g),
		       encode(sha256(g::text::bytea), 'hex'), '192.0.2.1',
		       'Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0 Safari/537.36',
		       'ok', sha256(('p' || g)::bytea), sha256(g::text::bytea)
		  FROM generate_series(1, $1) g`, n); err != nil {
		t.Fatalf("audittest: %d rows: %v", n, err)
	}
}
