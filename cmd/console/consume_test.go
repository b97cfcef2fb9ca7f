package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/broker/natsembedded"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// `console relay` and two `console consume` processes with OUTBOX_SHARDS=4
// and split shard sets: every event reaches consume_effect once, each
// aggregate in order, and the shard positions were committed by both.
func TestShardedRelayAndConsumeSubcommands(t *testing.T) {
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
	const events = 200
	for i := range events {
		err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Insert(ctx, tx, outbox.Event{AggregateType: "cmd", AggregateID: string(rune('a' + i%20)),
				Topic: "cmd.test", EventType: "cmd.test.v1", Payload: []byte(`{}`)})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	base := map[string]string{
		"DATABASE_URL": url, "BROKER_URL": srv.ClientURL(), "BROKER_NAMESPACE": "cmdshard", "RELAY_POLL_INTERVAL": "50ms",
		"OUTBOX_SHARDS": "4",
	}
	with := func(k, v string) config.Lookup {
		m := map[string]string{k: v}
		for a, b := range base {
			m[a] = b
		}
		return config.MapLookup(m)
	}
	runCtx, stop := context.WithCancel(ctx)
	var out lockedBuffer
	codes := make(chan int, 3)
	for _, p := range []struct {
		sub    string
		lookup config.Lookup
	}{
		{"relay", config.MapLookup(base)},
		{"consume", with("CONSUME_SHARDS_OWNED", "0-1")},
		{"consume", with("CONSUME_SHARDS_OWNED", "2,3")},
	} {
		go func() { codes <- run(runCtx, []string{p.sub}, env{lookup: p.lookup, stdout: &out, stderr: &out}) }()
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
			t.Fatalf("%d of %d effects applied; output:\n%s", n, events, out.b.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	for range 3 {
		if code := <-codes; code != 0 {
			t.Fatalf("subcommand exited %d after stop; output:\n%s", code, out.b.String())
		}
	}
	var rows, disorder, moved int
	if err := pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM consume_effect),
		       (SELECT count(*) FROM (SELECT aggregate_seq, row_number() OVER (PARTITION BY aggregate_id ORDER BY effect_id) AS nth
		                                FROM consume_effect) x WHERE aggregate_seq <> nth),
		       (SELECT count(*) FROM inbox_shard_position WHERE shards = 4 AND position > 0)`).Scan(&rows, &disorder, &moved); err != nil {
		t.Fatal(err)
	}
	if rows != events || disorder != 0 || moved != 4 {
		t.Fatalf("%d effect rows (want %d), %d out of order, %d of 4 shard positions moved", rows, events, disorder, moved)
	}
}

// A consumer or relay started on another shard count (or ordering) than the
// running relays says so at start, before anything is missed; one that
// agrees says nothing of it.
func TestWorkersWarnAtStartWhenTheRelaysPublishOtherwise(t *testing.T) {
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
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_relay (id, name, host, pid, started_at, seen_at, expires_at, shards, ordered)
		VALUES (gen_random_uuid(), 'running', 'h1', 1, now(), now(), now() + interval '1 hour', 16, true)`); err != nil {
		t.Fatal(err)
	}
	start := func(sub string, vars map[string]string) string {
		t.Helper()
		m := map[string]string{"DATABASE_URL": url, "BROKER_URL": srv.ClientURL(), "BROKER_NAMESPACE": "warn", "RELAY_POLL_INTERVAL": "50ms"}
		for k, v := range vars {
			m[k] = v
		}
		runCtx, stop := context.WithCancel(ctx)
		var out lockedBuffer
		code := make(chan int, 1)
		go func() {
			code <- run(runCtx, []string{sub}, env{lookup: config.MapLookup(m), stdout: &out, stderr: &out})
		}()
		// Its own report is its first write after the check: wait for it.
		deadline := time.Now().Add(30 * time.Second)
		for {
			var n int
			if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_relay) + (SELECT count(*) FROM inbox_consumer_process)`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n > 1 {
				break
			}
			if time.Now().After(deadline) {
				stop()
				t.Fatalf("%s never reported; output:\n%s", sub, out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		stop()
		if c := <-code; c != 0 {
			t.Fatalf("%s exited %d; output:\n%s", sub, c, out.String())
		}
		return out.String()
	}
	const consumeWarning, relayWarning = "the running relays publish on another shard count", "the running relays publish differently"
	if out := start("consume", map[string]string{"OUTBOX_SHARDS": "8"}); !strings.Contains(out, consumeWarning) || !strings.Contains(out, `"running_relays_outbox_shards":[16]`) {
		t.Errorf("consume on 8 shards against relays on 16: no warning in\n%s", out)
	}
	if out := start("consume", map[string]string{"OUTBOX_SHARDS": "16"}); strings.Contains(out, consumeWarning) {
		t.Errorf("consume on the relays' 16 shards warned:\n%s", out)
	}
	if out := start("relay", map[string]string{"OUTBOX_SHARDS": "16", "RELAY_ORDERING": "false"}); !strings.Contains(out, relayWarning) {
		t.Errorf("a relay with ordering off beside one with it on: no warning in\n%s", out)
	}
	if out := start("relay", map[string]string{"OUTBOX_SHARDS": "16"}); strings.Contains(out, relayWarning) {
		t.Errorf("a relay publishing as the running one warned:\n%s", out)
	}
}
