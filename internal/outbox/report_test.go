package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// counts are a read's running, paused and silent relays.
func counts(r outbox.Relays) [3]int64 { return [3]int64{r.Running, r.Paused, r.Silent} }

func readRelays(t *testing.T, q db.RowQuerier) outbox.Relays {
	t.Helper()
	r, err := outbox.ReadRelays(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A relay's report follows it: running from the start, paused while the
// broker refuses (since the pause began, not since the last report), running
// again once the broker is back, and gone when Run returns.
func TestRelayReportsRunningPausedAndStopped(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	var refusing atomic.Bool
	pub := &memPublisher{name: "r", log: &pubLog{}, before: func(context.Context, broker.Message) error {
		if refusing.Load() {
			return fmt.Errorf("%w: connection refused", broker.ErrUnavailable)
		}
		return nil
	}}
	if got := readRelays(t, pool); counts(got) != [3]int64{} {
		t.Fatalf("before any relay ran: %+v, want nothing", got)
	}
	r, err := outbox.NewRelay(pool, pub, outbox.RelayConfig{Name: "reporter", PollInterval: 5 * time.Millisecond,
		DisableListen: true, ReportInterval: 50 * time.Millisecond,
		Backoff: outbox.Backoff{Base: 5 * time.Millisecond, Cap: time.Hour}, OutagePauseCap: 20 * time.Millisecond}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	testkit.Until(t, "the relay reported as running", func() bool { return counts(readRelays(t, pool)) == [3]int64{1, 0, 0} })
	var name, host string
	var pid int
	if err := pool.QueryRow(ctx, `SELECT name, host, pid FROM outbox_relay`).Scan(&name, &host, &pid); err != nil {
		t.Fatal(err)
	}
	if name != "reporter" || host == "" || pid <= 0 {
		t.Fatalf("the relay's row says name %q, host %q, pid %d", name, host, pid)
	}
	if rows := listRelays(t, pool); len(rows) != 1 || rows[0].Published != 0 || rows[0].PublishedAt != nil {
		t.Fatalf("before any publish: %+v, want nothing published", rows)
	}

	// The broker refuses: the relay pauses on the next batch and says so at
	// once, not at its next interval's report.
	refusing.Store(true)
	bulkInsert(t, pool, "report", 5, 1)
	var paused outbox.Relays
	testkit.Until(t, "the relay reported as paused", func() bool {
		paused = readRelays(t, pool)
		return paused.Paused == 1
	})
	if paused.Running != 0 || paused.Silent != 0 || paused.PausedSince.IsZero() {
		t.Fatalf("paused relay read as %+v", paused)
	}
	// Its report says what failed, in the broker's words.
	testkit.Until(t, "the outage in the relay's report", func() bool {
		rows := listRelays(t, pool)
		return len(rows) == 1 && rows[0].Failed > 0 && rows[0].LastErrorAt != nil &&
			strings.Contains(rows[0].LastError, "connection refused")
	})
	// Reports go on while the pause lasts; its start stays put.
	var seen time.Time
	if err := pool.QueryRow(ctx, `SELECT seen_at FROM outbox_relay`).Scan(&seen); err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, "another report during the pause", func() bool {
		var now time.Time
		if err := pool.QueryRow(ctx, `SELECT seen_at FROM outbox_relay`).Scan(&now); err != nil {
			t.Fatal(err)
		}
		return now.After(seen)
	})
	if again := readRelays(t, pool); again.Paused != 1 || !again.PausedSince.Equal(paused.PausedSince) {
		t.Fatalf("later in the pause: %+v, want paused since %s still", again, paused.PausedSince)
	}

	refusing.Store(false)
	testkit.Until(t, "the relay reported as running again", func() bool { return counts(readRelays(t, pool)) == [3]int64{1, 0, 0} })
	// What it published once the broker was back, in its report.
	testkit.Until(t, "the five events in the relay's report", func() bool {
		rows := listRelays(t, pool)
		return len(rows) == 1 && rows[0].Published == 5 && rows[0].PublishedAt != nil
	})
	if row := listRelays(t, pool)[0]; row.PublishedAt.Before(paused.PausedSince) || row.PublishedAt.After(row.SeenAt) {
		t.Fatalf("last publish at %s: want after the pause began (%s) and by the last report (%s)", row.PublishedAt, paused.PausedSince, row.SeenAt)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_relay`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Fatalf("%d rows in outbox_relay after Run returned, want its row deleted", rows)
	}
}

func listRelays(t *testing.T, q db.Querier) []outbox.RelayRow {
	t.Helper()
	rows, _, err := outbox.ListRelays(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// A relay whose publish hangs still reports (its reports run beside its
// claims), so its state alone says running; its last publish stays where it
// was while its reports go on, which is what the relays page shows.
func TestAStuckRelayReportsButItsLastPublishAges(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	var calls atomic.Int64
	release := make(chan struct{})
	pub := &memPublisher{name: "r", log: &pubLog{}, before: func(ctx context.Context, _ broker.Message) error {
		if calls.Add(1) > 3 { // the first batch of three goes through
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}}
	r, err := outbox.NewRelay(pool, pub, outbox.RelayConfig{Name: "stuck", PollInterval: 5 * time.Millisecond,
		DisableListen: true, ReportInterval: 20 * time.Millisecond}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	bulkInsert(t, pool, "stuck", 3, 1)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	var first outbox.RelayRow
	testkit.Until(t, "the first three published", func() bool {
		rows := listRelays(t, pool)
		if len(rows) == 1 && rows[0].Published == 3 && rows[0].PublishedAt != nil {
			first = rows[0]
			return true
		}
		return false
	})
	bulkInsert(t, pool, "stuck-later", 3, 1)
	testkit.Until(t, "the relay stuck in its publish", func() bool { return calls.Load() > 3 })
	testkit.Until(t, "reports going on during the hang", func() bool {
		rows := listRelays(t, pool)
		return len(rows) == 1 && rows[0].SeenAt.Sub(first.SeenAt) > 200*time.Millisecond
	})
	later := listRelays(t, pool)[0]
	if later.State != outbox.RelayRunning || later.Published != 3 || !later.PublishedAt.Equal(*first.PublishedAt) {
		t.Fatalf("stuck relay's report: %+v; want running, still 3 published at %s", later, first.PublishedAt)
	}
	close(release)
	testkit.Until(t, "the rest published once the publish returns", func() bool {
		rows := listRelays(t, pool)
		return len(rows) == 1 && rows[0].Published == 6 && rows[0].PublishedAt.After(*first.PublishedAt)
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A relay that dies without signing off (here: its connections cut, as a
// kill -9 or a lost host would) is shown as silent once three intervals
// pass, and another relay's report forgets it an hour later. A live relay
// is never forgotten, whatever the others' clocks.
func TestARelayThatDiesIsSilentThenForgotten(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	victimPool, err := db.OpenConfig(ctx, pool.Config())
	if err != nil {
		t.Fatal(err)
	}
	pub := &memPublisher{name: "victim", log: &pubLog{}}
	victim, err := outbox.NewRelay(victimPool, pub, outbox.RelayConfig{Name: "victim", DisableListen: true,
		ReportInterval: 50 * time.Millisecond}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	victimCtx, kill := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- victim.Run(victimCtx) }()
	testkit.Until(t, "the victim reported as running", func() bool { return counts(readRelays(t, pool)) == [3]int64{1, 0, 0} })
	var last time.Time
	if err := pool.QueryRow(ctx, `SELECT seen_at FROM outbox_relay`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	// Its connections go first, so it cannot sign off.
	victimPool.Close()
	kill()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var silent outbox.Relays
	testkit.Until(t, "the dead relay shown as silent", func() bool {
		silent = readRelays(t, pool)
		return silent.Silent == 1
	})
	if silent.Running != 0 || silent.Paused != 0 || silent.SilentLast.Before(last) {
		t.Fatalf("dead relay read as %+v, want silent only, last seen at or after %s", silent, last)
	}

	// A relay whose clock is two hours on reports: the victim, silent for
	// over an hour by that clock, goes; the reporter itself stays.
	later := time.Now().Add(2 * time.Hour)
	other, err := outbox.NewRelay(pool, &memPublisher{name: "other", log: &pubLog{}}, outbox.RelayConfig{Name: "other",
		DisableListen: true, Now: func() time.Time { return later }}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	otherCtx, stop := context.WithCancel(ctx)
	defer stop()
	otherDone := make(chan error, 1)
	go func() { otherDone <- other.Run(otherCtx) }()
	testkit.Until(t, "the silent relay forgotten", func() bool {
		var names []string
		if err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(name), '{}') FROM outbox_relay`).Scan(&names); err != nil {
			t.Fatal(err)
		}
		return len(names) == 1 && names[0] == "other"
	})
	if got := readRelays(t, pool); counts(got) != [3]int64{1, 0, 0} {
		t.Fatalf("after the silent relay was forgotten: %+v, want the one live relay", got)
	}
	stop()
	if err := <-otherDone; err != nil {
		t.Fatal(err)
	}
}

// Relays delete rows silent for an hour; when none runs to delete them, the
// console's reads pass over them all the same, so a relay killed days ago
// is not shown as silent for ever.
func TestARelaySilentForOverAnHourIsNotShownWhenNoRelayDeletesIt(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_relay (id, name, host, pid, started_at, seen_at, expires_at, shards, ordered)
		VALUES (gen_random_uuid(), 'long-gone', 'h', 1, now() - interval '3 hours', now() - interval '62 minutes', now() - interval '61 minutes', 0, true),
		       (gen_random_uuid(), 'just-gone', 'h', 2, now() - interval '3 hours', now() - interval '60 minutes', now() - interval '59 minutes', 0, true)`); err != nil {
		t.Fatal(err)
	}
	got := readRelays(t, pool)
	if got.Silent != 1 || got.Alive() != 0 {
		t.Fatalf("relays read as %+v, want only the relay silent for less than an hour", got)
	}
	rows, _, err := outbox.ListRelays(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Name != "just-gone" || rows[0].State != outbox.RelaySilent || rows[0].Since == nil {
		t.Fatalf("relays listed: %+v, want just-gone, silent", rows)
	}
}

// Relays that publish differently (another OUTBOX_SHARDS, ordering on and
// off) break what consumers rely on; the read says so while both run, and
// not once the odd one has stopped.
func TestRelaysThatPublishDifferentlyDisagree(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	run := func(name string, cfg outbox.RelayConfig) (stop func()) {
		cfg.Name, cfg.DisableListen, cfg.ReportInterval = name, true, 50*time.Millisecond
		r, err := outbox.NewRelay(pool, &memPublisher{name: name, log: &pubLog{}}, cfg, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}
	stopSharded := run("sharded", outbox.RelayConfig{Shards: 16})
	defer stopSharded()
	testkit.Until(t, "the sharded relay reported", func() bool { return readRelays(t, pool).Running == 1 })
	if got := readRelays(t, pool); got.Disagree() || fmt.Sprint(got.Shards, got.Ordered) != "[16] [true]" {
		t.Fatalf("one relay: %+v, want shards [16], ordered [true], no disagreement", got)
	}
	stopOdd := run("unsharded-unordered", outbox.RelayConfig{DisableOrdering: true})
	testkit.Until(t, "both relays reported", func() bool { return readRelays(t, pool).Running == 2 })
	if got := readRelays(t, pool); !got.Disagree() || fmt.Sprint(got.Shards, got.Ordered) != "[0 16] [false true]" {
		t.Fatalf("two relays publishing differently: %+v, want shards [0 16], ordered [false true], a disagreement", got)
	}
	rows, _, err := outbox.ListRelays(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]string{}
	for _, r := range rows {
		byName[r.Name] = fmt.Sprint(r.Shards, r.Ordered)
	}
	if byName["sharded"] != "16 true" || byName["unsharded-unordered"] != "0 false" {
		t.Fatalf("relays listed with %v", byName)
	}
	stopOdd()
	if got := readRelays(t, pool); got.Disagree() || got.Running != 1 {
		t.Fatalf("after the odd relay stopped: %+v, want one relay and no disagreement", got)
	}
}

// A relay whose publishes are refused (not an outage: it does not pause)
// is failing from its first refusal until it publishes again; the count and
// the row agree.
func TestARelayWhosePublishesAreRefusedIsFailing(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	var refusing atomic.Bool
	refusing.Store(true)
	pub := &memPublisher{name: "r", log: &pubLog{}, before: func(context.Context, broker.Message) error {
		if refusing.Load() {
			return errors.New("permissions violation for publish")
		}
		return nil
	}}
	r, err := outbox.NewRelay(pool, pub, outbox.RelayConfig{Name: "refused", PollInterval: 5 * time.Millisecond, DisableListen: true,
		ReportInterval: 20 * time.Millisecond, MaxAttempts: 1000, Backoff: outbox.Backoff{Base: 5 * time.Millisecond, Cap: 20 * time.Millisecond}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	bulkInsert(t, pool, "refused", 2, 1)
	testkit.Until(t, "the relay counted as failing", func() bool { return readRelays(t, pool).Failing == 1 })
	row := listRelays(t, pool)[0]
	if !row.Failing || row.Failed == 0 || !strings.Contains(row.LastError, "permissions violation") || row.Published != 0 {
		t.Fatalf("refused relay's row %+v: want failing, with the broker's words, nothing published", row)
	}
	if got := readRelays(t, pool); got.Running != 1 || got.Paused != 0 {
		t.Fatalf("a refusal is no outage: %+v, want running, not paused", got)
	}
	refusing.Store(false)
	testkit.Until(t, "both published", func() bool { return listRelays(t, pool)[0].Published == 2 })
	if got, row := readRelays(t, pool), listRelays(t, pool)[0]; got.Failing != 0 || row.Failing {
		t.Fatalf("after publishing: %+v, row %+v; want not failing", got, row)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// The same margin for relays: a failure after the last publish counts only
// once the relay has not published for two report intervals, and never
// while it is paused (an outage is not its failure).
func TestRelayFailingWaitsTwoReportIntervalsWithoutAPublish(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	if _, err := pool.Exec(context.Background(), `
		INSERT INTO outbox_relay (id, name, host, pid, started_at, seen_at, expires_at, unavailable_since, shards, ordered, published, published_at, failed, last_error, last_error_at)
		VALUES (gen_random_uuid(), 'busy', 'h', 1, now() - interval '1 hour', now(), now() + interval '15 seconds', NULL, 0, true, 100, now() - interval '2 seconds', 1, 'refused', now() - interval '1 second'),
		       (gen_random_uuid(), 'stuck', 'h', 2, now() - interval '1 hour', now(), now() + interval '15 seconds', NULL, 0, true, 100, now() - interval '20 seconds', 9, 'refused', now() - interval '1 second'),
		       (gen_random_uuid(), 'paused', 'h', 3, now() - interval '1 hour', now(), now() + interval '15 seconds', now(), 0, true, 100, now() - interval '20 seconds', 9, 'refused', now() - interval '1 second'),
		       (gen_random_uuid(), 'never', 'h', 4, now() - interval '1 minute', now(), now() + interval '15 seconds', NULL, 0, true, 0, NULL, 2, 'refused', now() - interval '1 second')`); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, r := range listRelays(t, pool) {
		got[r.Name] = r.Failing
	}
	want := map[string]bool{"busy": false, "stuck": true, "paused": false, "never": true}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("failing: got %v, want %v", got, want)
	}
	if n := readRelays(t, pool).Failing; n != 2 {
		t.Fatalf("Relays.Failing = %d, want the 2 rows the list flags", n)
	}
}
