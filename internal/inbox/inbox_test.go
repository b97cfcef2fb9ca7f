package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/inbox"
)

func TestMain(m *testing.M) {
	if shardHelperProcess() {
		return
	}
	dbtest.Main(m)
}

// effectRows counts the rows an effect wrote for id.
func effectRows(t *testing.T, pool *pgxpool.Pool, id string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM consume_effect WHERE event_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func recordEffect(ctx context.Context, id string) func(pgx.Tx) error {
	return func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO consume_effect (consumer, event_id, topic, event_type, aggregate_type, aggregate_id, aggregate_seq)
			VALUES ('c', $1, 't', 'e', 'a', 'x', 1)`, id)
		return err
	}
}

func statsOf(t *testing.T, in *inbox.Inbox, consumer string) inbox.ConsumerStats {
	t.Helper()
	all, err := in.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		if s.Consumer == consumer {
			return s
		}
	}
	return inbox.ConsumerStats{Consumer: consumer}
}

func counterValue(t *testing.T, reg *prometheus.Registry, name, consumer string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "consumer" && l.GetValue() == consumer {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// The same message delivered 10 times, one after another and then 10 times
// at once, applies its effect once; the other deliveries are counted.
func TestSameMessageAppliesOnce(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	reg := prometheus.NewRegistry()
	in := inbox.New(pool, inbox.WithMetrics(reg))
	ctx := context.Background()

	results := map[inbox.Result]int{}
	for range 10 {
		res, err := in.Handle(ctx, "billing", "m-seq", recordEffect(ctx, "m-seq"))
		if err != nil {
			t.Fatal(err)
		}
		results[res]++
	}
	if results[inbox.Applied] != 1 || results[inbox.Duplicate] != 9 {
		t.Fatalf("sequential results %v, want 1 applied, 9 duplicates", results)
	}

	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		got = map[inbox.Result]int{}
	)
	start := make(chan struct{})
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := in.Handle(ctx, "billing", "m-par", func(tx pgx.Tx) error {
				// Hold the transaction open a moment so the others pile up
				// on the same key.
				time.Sleep(20 * time.Millisecond)
				return recordEffect(ctx, "m-par")(tx)
			})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			got[res]++
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	if got[inbox.Applied] != 1 || got[inbox.Duplicate] != 9 {
		t.Fatalf("concurrent results %v, want 1 applied, 9 duplicates", got)
	}
	for _, id := range []string{"m-seq", "m-par"} {
		if n := effectRows(t, pool, id); n != 1 {
			t.Fatalf("effect of %s applied %d times", id, n)
		}
	}
	if s := statsOf(t, in, "billing"); s.Processed != 2 || s.Duplicates != 18 {
		t.Fatalf("stats %+v, want 2 processed, 18 duplicates", s)
	}
	if d := counterValue(t, reg, "sluice_inbox_duplicates_total", "billing"); d != 18 {
		t.Fatalf("sluice_inbox_duplicates_total = %v, want 18", d)
	}
	// Another consumer is a separate inbox.
	if res, err := in.Handle(ctx, "audit", "m-seq", func(pgx.Tx) error { return nil }); err != nil || res != inbox.Applied {
		t.Fatalf("other consumer: %v, %v", res, err)
	}
}

// A failing effect records nothing: the redelivery applies it.
func TestFailedEffectLeavesNoTrace(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	in := inbox.New(pool)
	ctx := context.Background()
	boom := errors.New("downstream refused")
	_, err := in.Handle(ctx, "c", "m1", func(tx pgx.Tx) error {
		if err := recordEffect(ctx, "m1")(tx); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Handle = %v, want the effect's error", err)
	}
	if n := effectRows(t, pool, "m1"); n != 0 {
		t.Fatalf("failed effect left %d rows", n)
	}
	if res, err := in.Handle(ctx, "c", "m1", recordEffect(ctx, "m1")); err != nil || res != inbox.Applied {
		t.Fatalf("redelivery: %v, %v; want applied", res, err)
	}
}

// Many messages of one consumer handled concurrently all apply: the
// processed counter is sharded, not one hot row, and sums correctly.
func TestConcurrentMessagesAreAllCounted(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	in := inbox.New(pool)
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				id := fmt.Sprintf("m-%d-%d", w, i)
				if _, err := in.Handle(ctx, "fan", id, recordEffect(ctx, id)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if s := statsOf(t, in, "fan"); s.Processed != 400 || s.Duplicates != 0 {
		t.Fatalf("stats %+v, want 400 processed", s)
	}
	var shards int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM inbox_consumer_shard WHERE consumer = 'fan'`).Scan(&shards); err != nil || shards < 2 {
		t.Fatalf("processed counts live on %d row(s) (%v): still one hot row", shards, err)
	}
}

// Per-aggregate versions: an event older than (or equal to) the applied one
// is dropped as stale, and counted; gaps are allowed.
func TestHandleVersionedDropsStaleEvents(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	in := inbox.New(pool)
	ctx := context.Background()
	v := func(seq int64) inbox.Version {
		return inbox.Version{AggregateType: "payment", AggregateID: "p1", Seq: seq}
	}
	steps := []struct {
		id   string
		seq  int64
		want inbox.Result
	}{
		{"e1", 1, inbox.Applied},
		{"e3", 3, inbox.Applied}, // a gap is fine
		{"e2", 2, inbox.Stale},   // late: older than 3
		{"e2", 2, inbox.Duplicate},
		{"e3b", 3, inbox.Stale}, // same version, other id
		{"e4", 4, inbox.Applied},
	}
	for _, s := range steps {
		res, err := in.HandleVersioned(ctx, "proj", s.id, v(s.seq), recordEffect(ctx, s.id))
		if err != nil {
			t.Fatal(err)
		}
		if res != s.want {
			t.Fatalf("%s (seq %d): %v, want %v", s.id, s.seq, res, s.want)
		}
	}
	for id, want := range map[string]int{"e1": 1, "e2": 0, "e3": 1, "e3b": 0, "e4": 1} {
		if n := effectRows(t, pool, id); n != want {
			t.Fatalf("effect of %s applied %d times, want %d", id, n, want)
		}
	}
	if s := statsOf(t, in, "proj"); s.Processed != 3 || s.Stale != 2 || s.Duplicates != 1 {
		t.Fatalf("stats %+v, want 3 processed, 2 stale, 1 duplicate", s)
	}
	// Another aggregate has its own sequence.
	if res, _ := in.HandleVersioned(ctx, "proj", "o1", inbox.Version{AggregateType: "payment", AggregateID: "p2", Seq: 1}, recordEffect(ctx, "o1")); res != inbox.Applied {
		t.Fatalf("other aggregate: %v", res)
	}
	if _, err := in.HandleVersioned(ctx, "proj", "bad", inbox.Version{AggregateType: "payment", AggregateID: "p1"}, recordEffect(ctx, "bad")); err == nil {
		t.Fatal("a versioned message without a sequence was accepted")
	}
}

// Pruning deletes only rows processed before the window, in small batches,
// however close to the edge the others are.
func TestPruneNeverRemovesRowsInsideTheWindow(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	now := time.Now().Truncate(time.Microsecond)
	retention := inbox.DefaultRetention
	cutoff := now.Add(-retention)
	// 120 old rows (the oldest 30 days old, the newest 1µs past the edge),
	// 60 inside the window (the oldest exactly at the edge).
	_, err := pool.Exec(ctx, `
		INSERT INTO inbox_message (consumer, message_id, processed_at)
		SELECT 'c' || (g % 3), 'old-' || g, $1::timestamptz - interval '1 microsecond' - (g - 1) * interval '6 hours'
		  FROM generate_series(1, 120) g
		UNION ALL
		SELECT 'c' || (g % 3), 'new-' || g, $1::timestamptz + (g - 1) * interval '1 hour'
		  FROM generate_series(1, 60) g`, cutoff)
	if err != nil {
		t.Fatal(err)
	}
	deleted, err := inbox.Prune(ctx, pool, retention, 25, now)
	if err != nil {
		t.Fatal(err)
	}
	if deleted != 120 {
		t.Fatalf("pruned %d, want 120", deleted)
	}
	var left, inside int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE message_id LIKE 'new-%' AND processed_at >= $1) FROM inbox_message`, cutoff).Scan(&left, &inside); err != nil {
		t.Fatal(err)
	}
	if left != 60 || inside != 60 {
		t.Fatalf("left %d rows (%d inside the window), want the 60 inside", left, inside)
	}
	if _, err := inbox.Prune(ctx, pool, retention, 0, now); err == nil {
		t.Fatal("a zero batch was accepted")
	}
}

// The reference consumer's effect rows are pruned with the inbox's retention,
// in batches, never inside the window.
func TestPruneEffectsKeepsTheWindow(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	now := time.Now().Truncate(time.Microsecond)
	cutoff := now.Add(-inbox.DefaultRetention)
	_, err := pool.Exec(ctx, `
		INSERT INTO consume_effect (consumer, event_id, topic, event_type, aggregate_type, aggregate_id, aggregate_seq, applied_at)
		SELECT 'c', 'old-' || g, 't', 't.v1', 'a', g::text, 1, $1::timestamptz - interval '1 microsecond' - (g - 1) * interval '1 hour'
		  FROM generate_series(1, 70) g
		UNION ALL
		SELECT 'c', 'new-' || g, 't', 't.v1', 'a', g::text, 1, $1::timestamptz + (g - 1) * interval '1 minute'
		  FROM generate_series(1, 30) g`, cutoff)
	if err != nil {
		t.Fatal(err)
	}
	deleted, err := inbox.PruneEffects(ctx, pool, inbox.DefaultRetention, 20, now)
	if err != nil {
		t.Fatal(err)
	}
	var left, inside int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE event_id LIKE 'new-%') FROM consume_effect`).Scan(&left, &inside); err != nil {
		t.Fatal(err)
	}
	if deleted != 70 || left != 30 || inside != 30 {
		t.Fatalf("deleted %d, left %d (%d inside the window), want 70 deleted and the 30 inside kept", deleted, left, inside)
	}
	if _, err := inbox.PruneEffects(ctx, pool, inbox.DefaultRetention, db.MaxDeleteBatch+1, now); err == nil {
		t.Fatal("a batch over the maximum was accepted")
	}
}
