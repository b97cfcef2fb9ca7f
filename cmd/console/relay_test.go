package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/auth/authtest"
	"github.com/sluice-dev/sluice/internal/broker/natsembedded"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/inbox/inboxtest"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/outbox/outboxtest"
)

// lockedBuffer is a writer two subcommands may share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// `console relay` and `console consume` wired end to end on embedded NATS:
// events written before they start reach the consume_effect table once, and
// both stop with exit 0 when their context ends (SIGINT).
func TestRelayAndConsumeSubcommands(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	ctx := context.Background()
	pool, err := db.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	const events = 50
	for i := range events {
		err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Insert(ctx, tx, outbox.Event{AggregateType: "cmd", AggregateID: string(rune('a' + i%5)),
				Topic: "cmd.test", EventType: "cmd.test.v1", Payload: []byte(`{}`)})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	envs := config.MapLookup(map[string]string{
		"DATABASE_URL": url, "BROKER_URL": srv.ClientURL(), "BROKER_NAMESPACE": "cmdtest", "RELAY_POLL_INTERVAL": "50ms",
	})
	runCtx, stop := context.WithCancel(ctx)
	var stderr lockedBuffer
	codes := make(chan int, 2)
	for _, sub := range []string{"relay", "consume"} {
		go func() { codes <- run(runCtx, []string{sub}, env{lookup: envs, stdout: &stderr, stderr: &stderr}) }()
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(DISTINCT event_id) FROM consume_effect`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == events {
			break
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("%d of %d effects applied; output:\n%s", n, events, stderr.b.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	for range 2 {
		if code := <-codes; code != 0 {
			t.Fatalf("subcommand exited %d after stop; output:\n%s", code, stderr.b.String())
		}
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM consume_effect`).Scan(&rows); err != nil || rows != events {
		t.Fatalf("%d effect rows (%v), want %d: each event once", rows, err, events)
	}
}

func TestWorkersRefuseAnOutOfDateSchema(t *testing.T) {
	t.Parallel()
	url := dbtest.EmptyURL(t)
	for _, sub := range []string{"relay", "consume", "prune"} {
		code, _, stderr := runConsole(t, map[string]string{"DATABASE_URL": url, "BROKER_URL": "nats://127.0.0.1:1"}, sub)
		if code != 1 || !strings.Contains(stderr, "schema is out of date") {
			t.Fatalf("console %s on an unmigrated database: code %d, stderr %q", sub, code, stderr)
		}
	}
}

func TestPruneSubcommand(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	ctx := context.Background()
	pool, err := db.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	outboxtest.Insert(t, pool, outboxtest.Seed{N: 30, Status: "published", Age: 9 * 24 * time.Hour})
	outboxtest.Insert(t, pool, outboxtest.Seed{N: 10})
	inboxtest.Processed(t, pool, "c", 5, 8*24*time.Hour)
	inboxtest.Processed(t, pool, "d", 3, 24*time.Hour)
	inboxtest.Effects(t, pool, "c", 4, 8*24*time.Hour)
	inboxtest.Effects(t, pool, "d", 2, 24*time.Hour)
	authtest.Refusals(t, pool, 9, 8*24*time.Hour)
	authtest.Refusals(t, pool, 2, 6*24*time.Hour)
	code, out, stderr := runConsole(t, map[string]string{"DATABASE_URL": url, "PRUNE_BATCH_SIZE": "7"}, "prune")
	if code != 0 || !strings.Contains(out, "outbox: deleted 30 ") || !strings.Contains(out, "inbox: deleted 5 ") ||
		!strings.Contains(out, "consume_effect: deleted 4 ") || !strings.Contains(out, "console_refusal: deleted 9 ") {
		t.Fatalf("prune: code %d, out %q, stderr %q", code, out, stderr)
	}
	var outboxLeft, inboxLeft int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_event WHERE status = 'pending'), (SELECT count(*) FROM inbox_message)`).Scan(&outboxLeft, &inboxLeft); err != nil {
		t.Fatal(err)
	}
	if outboxLeft != 10 || inboxLeft != 3 {
		t.Fatalf("left %d pending events and %d inbox rows, want 10 and 3", outboxLeft, inboxLeft)
	}
}
