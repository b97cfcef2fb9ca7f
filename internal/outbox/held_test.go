package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// refusing is a publisher that refuses chosen events until told otherwise.
type refusing struct {
	mu     sync.Mutex
	refuse map[string]bool // message id → refuse
}

func (r *refusing) set(id uuid.UUID, refuse bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refuse[id.String()] = refuse
}

func (r *refusing) before(_ context.Context, m broker.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refuse[m.ID] {
		return errors.New("consumer schema rejects this payload")
	}
	return nil
}

func drain(t *testing.T, r *outbox.Relay) {
	t.Helper()
	for {
		res, err := r.RunOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if res.Claimed == 0 {
			return
		}
	}
}

func seqsOf(log *pubLog, agg string) []int64 {
	var seqs []int64
	for _, p := range log.all() {
		if p.Msg.AggregateID == agg {
			seqs = append(seqs, p.Msg.AggregateSeq)
		}
	}
	return seqs
}

// A poison event dead-letters and holds only its own aggregate, visibly
// (the held read, the list's held filter, the detail's hold); a retry after
// the cause is fixed publishes it before its successors; a discard releases
// them; with ordering off nothing is held.
func TestPoisonHoldsOnlyItsAggregate(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	events := bulkInsert(t, pool, "h", 10, 4) // h-0 and h-1 get poison at seq 2
	byKey := map[string]seeded{}
	for _, e := range events {
		byKey[fmt.Sprintf("%s#%d", e.Agg, e.Seq)] = e
	}
	retried, discarded := byKey["h-0#2"], byKey["h-1#2"]
	pub := &refusing{refuse: map[string]bool{}}
	pub.set(retried.ID, true)
	pub.set(discarded.ID, true)
	log := &pubLog{}
	r, err := outbox.NewRelay(pool, &memPublisher{name: "r", log: log, before: pub.before}, outbox.RelayConfig{
		BatchSize: 7, MaxAttempts: 1, DisableListen: true,
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	drain(t, r)

	for a := 2; a < 10; a++ {
		if got := seqsOf(log, fmt.Sprintf("h-%d", a)); !slices.Equal(got, []int64{1, 2, 3, 4}) {
			t.Fatalf("h-%d published %v, want [1 2 3 4]: another aggregate's poison held it", a, got)
		}
	}
	for _, agg := range []string{"h-0", "h-1"} {
		if got := seqsOf(log, agg); !slices.Equal(got, []int64{1}) {
			t.Fatalf("%s published %v, want [1]: held behind its dead seq 2", agg, got)
		}
	}
	held, err := outbox.ReadHeld(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if held != (outbox.Held{Events: 4, Aggregates: 2}) {
		t.Fatalf("held %+v, want 4 events in 2 aggregates", held)
	}
	page, err := outbox.List(ctx, pool, outbox.Filter{Status: outbox.FilterHeld}, outbox.Page{Oldest: true})
	if err != nil {
		t.Fatal(err)
	}
	var heldIDs []uuid.UUID
	for _, row := range page.Rows {
		if !row.Held {
			t.Fatalf("listed as held but not flagged: %+v", row)
		}
		heldIDs = append(heldIDs, row.ID)
	}
	if want := []uuid.UUID{byKey["h-0#3"].ID, byKey["h-1#3"].ID, byKey["h-0#4"].ID, byKey["h-1#4"].ID}; !slices.Equal(heldIDs, want) {
		t.Fatalf("held list %v, want %v", heldIDs, want)
	}
	// The dashboard's number and the list its tile opens are one definition.
	total, err := outbox.Count(ctx, pool, outbox.Filter{Status: outbox.FilterHeldDead})
	if err != nil {
		t.Fatal(err)
	}
	if total.N != held.Events || total.Estimate {
		t.Fatalf("held_dead list counts %+v, the held tile %d", total, held.Events)
	}
	d, err := outbox.Detail(ctx, pool, byKey["h-0#4"].ID)
	if err != nil {
		t.Fatal(err)
	}
	if d.HeldBy == nil || d.HeldBy.ID != retried.ID || d.HeldBy.Status != outbox.StatusDead || d.Holds != 0 ||
		d.Prev == nil || d.Prev.Seq != 3 || d.Next != nil {
		t.Fatalf("detail of h-0#4: held by %+v, holds %d, prev %+v, next %+v", d.HeldBy, d.Holds, d.Prev, d.Next)
	}
	if d, err := outbox.Detail(ctx, pool, retried.ID); err != nil || d.Holds != 2 || d.HeldBy != nil || d.LastError == nil {
		t.Fatalf("detail of the poison: holds %d, held by %+v, last error %v (%v)", d.Holds, d.HeldBy, d.LastError, err)
	}

	// The cause is fixed: a retry publishes the poison first, then the rest.
	pub.set(retried.ID, false)
	if _, err := outbox.Retry(ctx, pool, retried.ID, outbox.StatusDead); err != nil {
		t.Fatal(err)
	}
	drain(t, r)
	if got := seqsOf(log, "h-0"); !slices.Equal(got, []int64{1, 2, 3, 4}) {
		t.Fatalf("after the retry h-0 published %v, want [1 2 3 4]", got)
	}
	if got := seqsOf(log, "h-1"); !slices.Equal(got, []int64{1}) {
		t.Fatalf("h-1 published %v while its poison is still dead", got)
	}
	// Discard releases the successors; the discarded event never goes out.
	if _, err := outbox.Discard(ctx, pool, discarded.ID, outbox.StatusDead, "payload cannot be repaired"); err != nil {
		t.Fatal(err)
	}
	drain(t, r)
	if got := seqsOf(log, "h-1"); !slices.Equal(got, []int64{1, 3, 4}) {
		t.Fatalf("after the discard h-1 published %v, want [1 3 4]", got)
	}
	if held, err := outbox.ReadHeld(ctx, pool); err != nil || held != (outbox.Held{}) {
		t.Fatalf("held %+v (%v) after the operator acted, want none", held, err)
	}
}

func TestNothingIsHeldWithOrderingOff(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	events := bulkInsert(t, pool, "u", 1, 3)
	pub := &refusing{refuse: map[string]bool{}}
	pub.set(events[0].ID, true)
	log := &pubLog{}
	r, err := outbox.NewRelay(pool, &memPublisher{name: "r", log: log, before: pub.before}, outbox.RelayConfig{
		MaxAttempts: 1, DisableListen: true, DisableOrdering: true,
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	drain(t, r)
	if got := seqsOf(log, "u-0"); !slices.Equal(got, []int64{2, 3}) {
		t.Fatalf("unordered relay published %v, want [2 3] past the dead seq 1", got)
	}
}

// Nothing is ever published out of aggregate_seq order with ordering on:
// 10,000 events in 500 aggregates, a publisher that refuses some events a
// random number of times (some until they die), two relays, and an operator
// loop that retries or discards each dead event as decided up front, until
// every event is published or discarded. Then each aggregate's publish
// order is its sequence order without the discarded events, and every event
// ended as decided.
func TestNothingPublishedOutOfOrderUnderRandomPoison(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const (
		aggregates  = 500
		perAgg      = 20
		maxAttempts = 3
	)
	events := bulkInsert(t, pool, "o", aggregates, perAgg)
	rng := rand.New(rand.NewPCG(9, uint64(time.Now().UnixNano())))
	type fate struct {
		refusals int  // publishes refused before one is accepted (maxAttempts or more: it dies)
		discard  bool // when dead, the operator discards it (else retries it, cause fixed)
	}
	var (
		mu      sync.Mutex
		fates   = map[string]*fate{}
		refused = map[string]int{}
		byID    = map[string]seeded{}
	)
	dying, discards := 0, 0
	for _, e := range events {
		f := &fate{}
		switch x := rng.IntN(100); {
		case x < 3: // poison: dies, then discarded
			f.refusals, f.discard = 1000, true
			dying++
			discards++
		case x < 6: // poison: dies, retried once the cause is fixed
			f.refusals = maxAttempts + rng.IntN(3)
			dying++
		case x < 15: // flaky: fails a few times, never dies
			f.refusals = 1 + rng.IntN(maxAttempts-1)
		}
		fates[e.ID.String()] = f
		byID[e.ID.String()] = e
	}
	t.Logf("%d events die (%d to be discarded)", dying, discards)
	log := &pubLog{}
	before := func(_ context.Context, m broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		f := fates[m.ID]
		if refused[m.ID] < f.refusals {
			refused[m.ID]++
			return fmt.Errorf("refused (%d)", refused[m.ID])
		}
		return nil
	}
	var wg sync.WaitGroup
	for i := range 2 {
		r, err := outbox.NewRelay(pool, &memPublisher{name: fmt.Sprint("r", i), log: log, before: before}, outbox.RelayConfig{
			Name: fmt.Sprint("r", i), BatchSize: 200, MaxAttempts: maxAttempts, DisableListen: true,
			PollInterval: 5 * time.Millisecond, Backoff: outbox.Backoff{Base: time.Microsecond, Cap: time.Microsecond},
		}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _ = r.Run(ctx) })
	}
	// The operator: look at the dead letters, act as decided.
	operate := func() error {
		page, err := outbox.List(ctx, pool, outbox.Filter{Status: outbox.StatusDead}, outbox.Page{Limit: outbox.MaxPageRows})
		if err != nil {
			return err
		}
		for _, row := range page.Rows {
			mu.Lock()
			f := fates[row.ID.String()]
			if !f.discard {
				f.refusals = 0 // the cause is fixed
			}
			mu.Unlock()
			err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
				var err error
				if f.discard {
					_, err = outbox.Discard(ctx, tx, row.ID, outbox.StatusDead, "decided by the test")
				} else {
					_, err = outbox.Retry(ctx, tx, row.ID, outbox.StatusDead)
				}
				return err
			})
			if err != nil {
				return err
			}
		}
		return nil
	}
	testkit.Eventually(t, "every event published or discarded", func() (bool, error) {
		if err := operate(); err != nil {
			return false, err
		}
		c := statusCounts(t, pool)
		return c[outbox.StatusPublished]+c[outbox.StatusDiscarded] == len(events), nil
	})
	cancel()
	wg.Wait()

	// Per aggregate, publish order = sequence order without the discarded.
	got := map[string][]int64{}
	for _, p := range log.all() {
		got[p.Msg.AggregateID] = append(got[p.Msg.AggregateID], p.Msg.AggregateSeq)
	}
	want := map[string][]int64{}
	for _, e := range events { // seq-major: each aggregate's seqs ascend
		if !fates[e.ID.String()].discard {
			want[e.Agg] = append(want[e.Agg], e.Seq)
		}
	}
	for agg, w := range want {
		if !slices.Equal(got[agg], w) {
			t.Fatalf("%s published %v, want %v", agg, got[agg], w)
		}
	}
	rows, err := pool.Query(context.Background(), `SELECT id, status FROM outbox_event`)
	if err != nil {
		t.Fatal(err)
	}
	statuses, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		ID     uuid.UUID
		Status string
	}])
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range statuses {
		wantStatus := outbox.StatusPublished
		if fates[s.ID.String()].discard {
			wantStatus = outbox.StatusDiscarded
		}
		if s.Status != wantStatus {
			t.Fatalf("event %s (%s #%d) is %s, decided %s", s.ID, byID[s.ID.String()].Agg, byID[s.ID.String()].Seq, s.Status, wantStatus)
		}
	}
}
