package inbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/natsbroker"
	"github.com/sluice-dev/sluice/internal/broker/natsembedded"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// embeddedNATS starts an embedded JetStream server for t and opens a broker
// on it in namespace ns; both stop when t ends.
func embeddedNATS(t *testing.T, ns string) (*natsembedded.Server, *natsbroker.JetStream) {
	t.Helper()
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := natsbroker.Open(ctx, srv.ClientURL(), broker.Options{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return srv, b
}

// shardsHeld reads sluice_inbox_shards_held{consumer="orders"} from reg.
func shardsHeld(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_inbox_shards_held" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "consumer" && l.GetValue() == "orders" {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no sluice_inbox_shards_held{consumer=\"orders\"} in the registry")
	return 0
}

func listProcesses(t *testing.T, pool *pgxpool.Pool) []inbox.ProcessRow {
	t.Helper()
	rows, _, err := inbox.ListProcesses(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func coverageOf(t *testing.T, pool *pgxpool.Pool, consumer string) inbox.Coverage {
	t.Helper()
	for _, c := range inbox.Cover(listProcesses(t, pool)) {
		if c.Consumer == consumer {
			return c
		}
	}
	return inbox.Coverage{}
}

// Consumer processes report what they read: two sharded processes that
// split the shards, then an unsharded one under the same name; the
// coverage names the shards nobody may read and the shard counts the
// relays do not publish on; a process that stops deletes its row and the
// other takes its shards over, which its report shows.
func TestConsumerProcessesReportWhatTheyRead(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, b := embeddedNATS(t, "presence")

	type proc struct {
		cancel context.CancelFunc
		done   chan error
	}
	run := func(f func(context.Context) error) proc {
		pctx, pcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- f(pctx) }()
		return proc{cancel: pcancel, done: done}
	}
	stop := func(p proc) {
		t.Helper()
		p.cancel()
		if err := <-p.done; err != nil {
			t.Fatal(err)
		}
	}
	sharded := func(owned []int, reg *prometheus.Registry) proc {
		c := &inbox.ShardedConsumer{Inbox: inbox.New(pool, inbox.WithMetrics(reg)), Name: "orders", Shards: 4, Owned: owned,
			RetryInterval: 50 * time.Millisecond, ReportInterval: 50 * time.Millisecond}
		return run(func(ctx context.Context) error { return c.Run(ctx, b) })
	}
	coverage := func(want inbox.Coverage) {
		t.Helper()
		var got inbox.Coverage
		testkit.Eventually(t, fmt.Sprintf("coverage %+v", want), func() (bool, error) {
			got = coverageOf(t, pool, "orders")
			return fmt.Sprint(got) == fmt.Sprint(want), fmt.Errorf("coverage %+v", got)
		})
	}

	firstMetrics := prometheus.NewRegistry()
	first := sharded([]int{0, 1}, firstMetrics)
	coverage(inbox.Coverage{Consumer: "orders", Running: 1, Shards: []int{4}, Unowned: []int{2, 3}})
	rows := listProcesses(t, pool)
	if len(rows) != 1 || rows[0].Silent || rows[0].Shards != 4 || !slices.Equal(rows[0].Owned, []int{0, 1}) ||
		!slices.Equal(rows[0].Held, []int{0, 1}) || rows[0].PID == 0 || rows[0].Host == "" {
		t.Fatalf("one process owning shards 0 and 1: %+v", rows)
	}
	// The process's own /metrics say the same.
	if n := shardsHeld(t, firstMetrics); n != 2 {
		t.Fatalf("sluice_inbox_shards_held = %v, want 2", n)
	}
	if m := inbox.Cover(rows)[0].Misread([]int{4}); m != nil {
		t.Fatalf("reading the relays' 4 shards is no misread: %v", m)
	}
	if m := inbox.Cover(rows)[0].Misread([]int{8}); !slices.Equal(m, []int{4}) {
		t.Fatalf("relays on 8 shards, the consumer on 4: misread %v, want [4]", m)
	}

	// A second process may read every shard: it takes the two nobody holds.
	second := sharded(nil, prometheus.NewRegistry())
	coverage(inbox.Coverage{Consumer: "orders", Running: 2, Shards: []int{4}})
	rows = listProcesses(t, pool)
	if len(rows) != 2 {
		t.Fatalf("two processes: %+v", rows)
	}
	for _, r := range rows {
		if (r.Owned == nil) != slices.Equal(r.Held, []int{2, 3}) {
			t.Fatalf("the process owning every shard should read 2 and 3, the other 0 and 1: %+v", rows)
		}
	}

	// The same consumer started unsharded: its processes read two counts.
	plain := &inbox.Consumer{Inbox: inbox.New(pool), Name: "orders", ReportInterval: 50 * time.Millisecond}
	third := run(func(ctx context.Context) error { return plain.Run(ctx, b) })
	coverage(inbox.Coverage{Consumer: "orders", Running: 3, Shards: []int{0, 4}})
	if m := coverageOf(t, pool, "orders").Misread([]int{4}); !slices.Equal(m, []int{0}) {
		t.Fatalf("relays on 4 shards, one process unsharded: misread %v, want [0]", m)
	}
	stop(third)

	// The first stops: its row goes, the second takes its shards.
	stop(first)
	if n := shardsHeld(t, firstMetrics); n != 0 {
		t.Fatalf("a stopped consumer's sluice_inbox_shards_held = %v, want 0", n)
	}
	coverage(inbox.Coverage{Consumer: "orders", Running: 1, Shards: []int{4}})
	testkit.Eventually(t, "the second process reading every shard", func() (bool, error) {
		rows = listProcesses(t, pool)
		return len(rows) == 1 && slices.Equal(rows[0].Held, []int{0, 1, 2, 3}), fmt.Errorf("rows %+v", rows)
	})
	stop(second)
	if rows := listProcesses(t, pool); len(rows) != 0 {
		t.Fatalf("every process stopped, yet rows remain: %+v", rows)
	}
}

// A consumer process that dies without signing off is shown as silent: its
// consumer's coverage counts it as silent only, and with no other process
// running the consumer has stopped; once silent for an hour, another
// process's report removes its row.
func TestAConsumerThatDiesIsSilentThenForgotten(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := db.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	srv, b := embeddedNATS(t, "silent")

	// The victim is a child process (sharded_test.go's helper: consumer
	// "sharded" on 16 shards), killed with SIGKILL: nothing of it signs off.
	var out bytes.Buffer
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), "SLUICE_SHARD_HELPER=1", "SLUICE_SHARD_DB="+url,
		"SLUICE_SHARD_NATS="+srv.ClientURL(), "SLUICE_SHARD_NS=silent", "SLUICE_SHARD_REPORT=50ms")
	child.Stdout, child.Stderr = &out, &out
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill() }()
	testkit.Eventually(t, "the victim reading all 16 shards", func() (bool, error) {
		rows := listProcesses(t, pool)
		return len(rows) == 1 && len(rows[0].Held) == 16 && rows[0].PID == child.Process.Pid,
			fmt.Errorf("rows %+v; child output:\n%s", rows, out.String())
	})
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	testkit.Eventually(t, "the dead process shown as silent", func() (bool, error) {
		rows := listProcesses(t, pool)
		return len(rows) == 1 && rows[0].Silent, fmt.Errorf("rows %+v", rows)
	})
	rows := listProcesses(t, pool)
	cov := inbox.Cover(rows)
	if len(cov) != 1 || cov[0].Running != 0 || cov[0].Silent != 1 || !cov[0].SilentLast.Equal(rows[0].SeenAt) || cov[0].Shards != nil {
		t.Fatalf("a silent process counts as silent only: %+v", cov)
	}
	if p := inbox.Problems(cov, []int{16}); len(p) != 1 || p[0].Kind != inbox.ProblemStopped || p[0].Consumer != "sharded" {
		t.Fatalf("the consumer's only process is dead: want it stopped, got %+v", p)
	}

	// An hour and more later (its expiry moved back by that much), a live
	// process's first report removes it, and the list passes over it even
	// before that.
	if _, err := pool.Exec(ctx, `UPDATE inbox_consumer_process SET expires_at = expires_at - interval '61 minutes', seen_at = seen_at - interval '61 minutes'`); err != nil {
		t.Fatal(err)
	}
	if rows := listProcesses(t, pool); len(rows) != 0 {
		t.Fatalf("a process silent for over an hour is still listed: %+v", rows)
	}
	other := &inbox.Consumer{Inbox: inbox.New(pool), Name: "audit", ReportInterval: 50 * time.Millisecond}
	octx, stop := context.WithCancel(ctx)
	odone := make(chan error, 1)
	go func() { odone <- other.Run(octx, b) }()
	testkit.Eventually(t, "the silent process's row removed", func() (bool, error) {
		var names []string
		err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(consumer), '{}') FROM inbox_consumer_process`).Scan(&names)
		return err == nil && slices.Equal(names, []string{"audit"}), fmt.Errorf("rows of %v (%v)", names, err)
	})
	stop()
	if err := <-odone; err != nil {
		t.Fatal(err)
	}
}

// Cover and Problems on their own: silent rows count only as silent, mixed
// shard counts are reported as such (no shard list, since no one count
// applies), an unsharded consumer has no shards to own, and a consumer with
// silent processes only has stopped.
func TestCoverSumsRunningProcessesOnly(t *testing.T) {
	t.Parallel()
	seen := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	rows := []inbox.ProcessRow{
		{Consumer: "a", Shards: 8, Owned: []int{0, 1, 2, 3}, Held: []int{0, 1, 2}},
		{Consumer: "a", Shards: 8, Owned: []int{4, 5, 6, 7}, Held: []int{4, 5, 6, 7}, Silent: true, SeenAt: seen},
		{Consumer: "b", Shards: 0},
		{Consumer: "c", Shards: 4},
		{Consumer: "c", Shards: 8, Owned: []int{1}},
		{Consumer: "d", Shards: 0, Silent: true, SeenAt: seen},
		{Consumer: "d", Shards: 0, Silent: true, SeenAt: seen.Add(time.Minute)},
	}
	got := inbox.Cover(rows)
	want := []inbox.Coverage{
		{Consumer: "a", Running: 1, Silent: 1, SilentLast: seen, Shards: []int{8}, Unowned: []int{4, 5, 6, 7}, Unheld: []int{3}},
		{Consumer: "b", Running: 1, Shards: []int{0}},
		{Consumer: "c", Running: 2, Shards: []int{4, 8}},
		{Consumer: "d", Silent: 2, SilentLast: seen.Add(time.Minute)},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Cover:\n got %+v\nwant %+v", got, want)
	}
	problems := inbox.Problems(got, []int{8})
	wantProblems := []inbox.Problem{
		{Consumer: "a", Kind: inbox.ProblemUnowned, Shards: 8, Unowned: []int{4, 5, 6, 7}},
		{Consumer: "b", Kind: inbox.ProblemMisread, Counts: []int{0}, Published: []int{8}},
		{Consumer: "c", Kind: inbox.ProblemMixed, Counts: []int{4, 8}},
		{Consumer: "c", Kind: inbox.ProblemMisread, Counts: []int{4}, Published: []int{8}},
		{Consumer: "d", Kind: inbox.ProblemStopped, SilentLast: seen.Add(time.Minute)},
	}
	if fmt.Sprint(problems) != fmt.Sprint(wantProblems) {
		t.Fatalf("Problems:\n got %+v\nwant %+v", problems, wantProblems)
	}
	if p := inbox.Problems(got[:2], nil); fmt.Sprint(p) != fmt.Sprint(wantProblems[:1]) {
		t.Fatalf("no relay reports, so no count is compared: got %+v", p)
	}
	if m := got[1].Misread(nil); m != nil {
		t.Fatalf("no relay reports: nothing to compare with, got misread %v", m)
	}
	if m := got[1].Misread([]int{0}); m != nil {
		t.Fatalf("unsharded consumer of unsharded relays: misread %v", m)
	}
	if m := got[2].Misread([]int{4, 8}); m != nil {
		t.Fatalf("relays disagreeing on 4 and 8 publish on both: misread %v", m)
	}
}

// A consumer whose effect keeps failing reports it: its failures count up
// and it is failing (its last failure newer than its last apply, nothing
// applied for two report intervals) until the effect goes through, then it
// is not.
func TestAConsumerWhoseEffectFailsReportsItFailing(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, b := embeddedNATS(t, "failing")
	var refusing atomic.Bool
	refusing.Store(true)
	record := inbox.RecordEffect("billing")
	c := &inbox.Consumer{Inbox: inbox.New(pool), Name: "billing", ReportInterval: 20 * time.Millisecond,
		Effect: func(ctx context.Context, tx pgx.Tx, m broker.Message) error {
			if refusing.Load() {
				return errors.New("the ledger refuses it")
			}
			return record(ctx, tx, m)
		}}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx, b) }()
	testkit.Eventually(t, "the consumer reporting", func() (bool, error) {
		rows := listProcesses(t, pool)
		return len(rows) == 1, fmt.Errorf("rows %+v", rows)
	})
	if err := b.Publish(ctx, broker.Message{ID: "m1", Topic: "billing.charged", EventType: "billing.charged.v1", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the failures in its report", func() (bool, error) {
		rows := listProcesses(t, pool)
		return len(rows) == 1 && rows[0].Failed >= 2 && rows[0].Failing && rows[0].Applied == 0, fmt.Errorf("rows %+v", rows)
	})
	refusing.Store(false)
	testkit.Eventually(t, "applied, and failing no more", func() (bool, error) {
		rows := listProcesses(t, pool)
		return len(rows) == 1 && rows[0].Applied == 1 && !rows[0].Failing && rows[0].Failed >= 2, fmt.Errorf("rows %+v", rows)
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// The same for a sharded consumer: a batch that fails is read again, and
// each failure counts in the process's report until a batch applies.
func TestAShardedConsumerWhoseBatchFailsReportsItFailing(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := db.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	preloadOutbox(t, pool, 20, 5)
	srv, b := embeddedNATS(t, "shardfail")
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	startShardRelays(rctx, t, &wg, pool, natsAt(srv.ClientURL(), "shardfail"), 1, 2)
	var refusing atomic.Bool
	refusing.Store(true)
	record := inbox.RecordBatchEffect("sharded")
	c := &inbox.ShardedConsumer{Inbox: inbox.New(pool), Name: "sharded", Shards: 2, RetryInterval: 20 * time.Millisecond,
		ReportInterval: 20 * time.Millisecond, Effect: func(ctx context.Context, tx pgx.Tx, msgs []broker.Message) error {
			if refusing.Load() {
				return errors.New("the ledger refuses it")
			}
			return record(ctx, tx, msgs)
		}}
	done := make(chan error, 1)
	wg.Go(func() { done <- c.Run(rctx, b) })
	testkit.Eventually(t, "the failures in its report", func() (bool, error) {
		rows := listProcesses(t, pool)
		return len(rows) == 1 && rows[0].Failed >= 2 && rows[0].Failing && rows[0].Applied == 0, fmt.Errorf("rows %+v", rows)
	})
	refusing.Store(false)
	testkit.Eventually(t, "all applied, and failing no more", func() (bool, error) {
		rows := listProcesses(t, pool)
		return len(rows) == 1 && rows[0].Applied == 20 && !rows[0].Failing, fmt.Errorf("rows %+v", rows)
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Failing needs a failure newer than the last apply and nothing applied for
// two report intervals: a process that applies all the time is not failing
// between a failed batch and the next one.
func TestFailingWaitsTwoReportIntervalsWithoutAnApply(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	if _, err := pool.Exec(context.Background(), `
		INSERT INTO inbox_consumer_process (id, consumer, host, pid, started_at, seen_at, expires_at, shards, applied, applied_at, failed, failed_at)
		VALUES (gen_random_uuid(), 'busy', 'h', 1, now() - interval '1 hour', now(), now() + interval '15 seconds', 0, 100, now() - interval '2 seconds', 1, now() - interval '1 second'),
		       (gen_random_uuid(), 'stuck', 'h', 2, now() - interval '1 hour', now(), now() + interval '15 seconds', 0, 100, now() - interval '20 seconds', 9, now() - interval '1 second'),
		       (gen_random_uuid(), 'fresh', 'h', 3, now() - interval '3 seconds', now(), now() + interval '15 seconds', 0, 0, NULL, 2, now() - interval '1 second'),
		       (gen_random_uuid(), 'never', 'h', 4, now() - interval '1 minute', now(), now() + interval '15 seconds', 0, 0, NULL, 2, now() - interval '1 second'),
		       (gen_random_uuid(), 'recovered', 'h', 5, now() - interval '1 hour', now(), now() + interval '15 seconds', 0, 100, now() - interval '1 second', 9, now() - interval '20 seconds')`); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, r := range listProcesses(t, pool) {
		got[r.Consumer] = r.Failing
	}
	want := map[string]bool{"busy": false, "stuck": true, "fresh": false, "never": true, "recovered": false}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("failing: got %v, want %v", got, want)
	}
}

// giveUpSubscriber stands for a broker the subscriber gave up on: it
// returns an error once the process has reported; stop is its other end,
// a deliberate stop (nil when its context ends).
type giveUpSubscriber struct{ fail bool }

func (s giveUpSubscriber) Subscribe(ctx context.Context, _ string, _ broker.Handler) error {
	if s.fail {
		time.Sleep(200 * time.Millisecond)
		return errors.New("consume failed 10 times in a row")
	}
	<-ctx.Done()
	return nil
}

// A consumer that gives up (its broker gone past its retries) does not
// sign off: its row stays, to go silent and be flagged. Signed off, it read
// as a deliberate stop while its queue filled with nobody reading (a
// RabbitMQ outage drill). A deliberate stop still signs off.
func TestAConsumerThatGivesUpDoesNotSignOff(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	c := &inbox.Consumer{Inbox: inbox.New(pool), Name: "gave-up", ReportInterval: 50 * time.Millisecond}
	if err := c.Run(context.Background(), giveUpSubscriber{fail: true}); err == nil {
		t.Fatal("the run that gave up returned no error")
	}
	if rows := listProcesses(t, pool); len(rows) != 1 || rows[0].Consumer != "gave-up" {
		t.Fatalf("after giving up: %+v, want its row left to go silent", rows)
	}
	stopped := &inbox.Consumer{Inbox: inbox.New(pool), Name: "stopped", ReportInterval: 50 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- stopped.Run(ctx, giveUpSubscriber{}) }()
	testkit.Eventually(t, "the second process's report", func() (bool, error) { return len(listProcesses(t, pool)) == 2, nil })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if rows := listProcesses(t, pool); len(rows) != 1 || rows[0].Consumer != "gave-up" {
		t.Fatalf("after a deliberate stop: %+v, want it signed off", rows)
	}
}
