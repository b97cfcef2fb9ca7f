package outbox

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// The mark commits asynchronously, and only the mark: synchronous_commit is
// off inside its transaction and back on afterwards. It must also keep using
// the pending index (the async switch is a one-row subquery, no scan).
func TestMarkCommitsAsynchronouslyOnlyItself(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	id, token := uuid.Must(uuid.NewV7()), uuid.New()
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, lock_token, locked_until)
		VALUES ($1, 'mark', 'a', 1, 't', 'mark.v1', '{}', $2, now() + interval '1 minute')`, id, token); err != nil {
		t.Fatal(err)
	}
	// One connection, synchronous on for its session whatever the server's
	// setting, so the test tells the mark's own switch from the server's.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET synchronous_commit = on`); err != nil {
		t.Fatal(err)
	}
	const before = "on"
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	tag, err := tx.Exec(ctx, markPublishedSQL, []uuid.UUID{id}, token, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() != 1 {
		t.Fatalf("marked %d rows, want 1", tag.RowsAffected())
	}
	var inside string
	if err := tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&inside); err != nil {
		t.Fatal(err)
	}
	if inside != "off" {
		t.Fatalf("synchronous_commit inside the mark's transaction = %q, want off", inside)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var after, status string
	if err := conn.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), (SELECT status FROM outbox_event WHERE id = $1)`, id).Scan(&after, &status); err != nil {
		t.Fatal(err)
	}
	if after != before || status != StatusPublished {
		t.Fatalf("after the mark: synchronous_commit %q (want %q), status %q", after, before, status)
	}
}
