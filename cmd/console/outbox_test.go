package main

import (
	"context"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// `console outbox pause|resume TOPIC --reason R`: a reason is required; the
// pause is stored with the CLI actor and audited as from the console;
// pausing a paused topic and resuming a running one exit 1 and change
// nothing, audited as conflicts.
func TestOutboxPauseAndResumeFromTheCommandLine(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	ctx := context.Background()
	pool, err := db.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	envs := map[string]string{"DATABASE_URL": url, "OUTBOX_ACTOR": "ann@ops-host"}
	audits := func(where string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM audit_event WHERE target_type = 'outbox_topic' AND target_id = 'billing' AND `+where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	paused := func() (by, reason string) {
		t.Helper()
		_ = pool.QueryRow(ctx, `SELECT paused_by, reason FROM outbox_topic_pause WHERE topic = 'billing'`).Scan(&by, &reason)
		return by, reason
	}

	if code, _, stderr := runConsole(t, envs, "outbox", "pause", "billing"); code != 2 || !strings.Contains(stderr, "--reason") {
		t.Fatalf("pause without reason: code %d, stderr %s", code, stderr)
	}
	if code, _, _ := runConsole(t, envs, "outbox", "pause"); code != 2 {
		t.Fatalf("pause without topic: code %d", code)
	}
	code, out, stderr := runConsole(t, envs, "outbox", "pause", "billing", "--reason", "ledger migration")
	if code != 0 || !strings.Contains(out, "billing paused by ann@ops-host") {
		t.Fatalf("pause: code %d\n%s\n%s", code, out, stderr)
	}
	if by, reason := paused(); by != "ann@ops-host" || reason != "ledger migration" {
		t.Fatalf("stored pause: %q %q", by, reason)
	}
	if n := audits(`action = 'outbox.topic.pause' AND outcome = 'ok' AND actor_iss = 'cli' AND actor_name = 'ann@ops-host' AND reason = 'ledger migration'`); n != 1 {
		t.Fatalf("%d ok pause audit rows, want 1", n)
	}
	code, _, stderr = runConsole(t, envs, "outbox", "pause", "billing", "--reason", "again")
	if code != 1 || !strings.Contains(stderr, "already paused by ann@ops-host") {
		t.Fatalf("second pause: code %d, stderr %s", code, stderr)
	}
	if n := audits(`action = 'outbox.topic.pause' AND error_code = 'conflict'`); n != 1 {
		t.Fatalf("%d conflict audit rows, want 1", n)
	}
	code, out, _ = runConsole(t, envs, "outbox", "resume", "billing", "--reason", "migration done")
	if code != 0 || !strings.Contains(out, "billing resumed") {
		t.Fatalf("resume: code %d %s", code, out)
	}
	if by, _ := paused(); by != "" {
		t.Fatal("still paused after resume")
	}
	if n := audits(`action = 'outbox.topic.resume' AND outcome = 'ok' AND actor_name = 'ann@ops-host'`); n != 1 {
		t.Fatalf("%d ok resume audit rows, want 1", n)
	}
	if code, _, stderr = runConsole(t, envs, "outbox", "resume", "billing", "--reason", "again"); code != 1 || !strings.Contains(stderr, "not paused") {
		t.Fatalf("second resume: code %d %s", code, stderr)
	}
}

// `console outbox recount` repairs the backlog counts after a status was
// changed by hand (the product's own writes keep them exact).
func TestOutboxRecountFromTheCommandLine(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	ctx := context.Background()
	pool, err := db.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload)
		SELECT gen_random_uuid(), 'cli', 'a' || g, 1, 'billing', 'cli.v1', '{}' FROM generate_series(1, 5) g;
		UPDATE outbox_event SET status = 'dead', dead_at = now() WHERE aggregate_id IN ('a1', 'a2')`); err != nil {
		t.Fatal(err)
	}
	envs := map[string]string{"DATABASE_URL": url}
	if code, _, _ := runConsole(t, envs, "outbox", "recount", "billing"); code != 2 {
		t.Fatalf("recount with an argument: code %d", code)
	}
	code, out, stderr := runConsole(t, envs, "outbox", "recount")
	if code != 0 || !strings.Contains(out, "3 pending, 2 dead") {
		t.Fatalf("recount: code %d\n%s\n%s", code, out, stderr)
	}
	var pending, dead int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(n) FILTER (WHERE status = 'pending'), 0), coalesce(sum(n) FILTER (WHERE status = 'dead'), 0)
		FROM outbox_backlog_count`).Scan(&pending, &dead); err != nil || pending != 3 || dead != 2 {
		t.Fatalf("counts after recount: %d pending, %d dead (%v)", pending, dead, err)
	}
}
