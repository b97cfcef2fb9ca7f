package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// commitGate makes the COMMIT of a claim (an UPDATE that leaves a row
// pending under a lease token) wait for the advisory lock 4242, or fail
// while refuse_claim_commit holds a row: a deferred constraint trigger runs
// at COMMIT. The relay's other writes (marks, releases) pass straight through.
const commitGate = `
	CREATE TABLE refuse_claim_commit (x int);
	CREATE FUNCTION gate_claim_commit() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		IF NEW.status = 'pending' AND NEW.lock_token IS NOT NULL THEN
			IF EXISTS (SELECT 1 FROM refuse_claim_commit) THEN
				RAISE EXCEPTION 'test: the claim''s COMMIT is refused';
			END IF;
			PERFORM pg_advisory_xact_lock_shared(4242);
		END IF;
		RETURN NULL;
	END $$;
	CREATE CONSTRAINT TRIGGER gate_claim_commit AFTER UPDATE ON outbox_event
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION gate_claim_commit()`

// The relay publishes a claimed batch while the claim's COMMIT is still on
// its way, and marks it only once the COMMIT is done: an event's way to the
// broker does not wait for its lease's flush.
func TestRelayPublishesWhileTheClaimCommitsAndMarksAfter(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	ev := bulkInsert(t, pool, "gate", 1, 1)[0]
	if _, err := pool.Exec(ctx, commitGate); err != nil {
		t.Fatal(err)
	}
	gate, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer gate.Release()
	if _, err := gate.Exec(ctx, `SELECT pg_advisory_lock(4242)`); err != nil {
		t.Fatal(err)
	}
	log := &pubLog{}
	r, err := outbox.NewRelay(pool, &memPublisher{name: "r", log: log}, outbox.RelayConfig{DisableListen: true, Now: newClock().Now}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan outbox.BatchResult, 1)
	go func() {
		res, err := r.RunOnce(ctx)
		if err != nil {
			t.Errorf("RunOnce: %v", err)
		}
		done <- res
	}()
	testkit.Eventually(t, "the event published while the claim's COMMIT waits", func() (bool, error) { return len(log.all()) == 1, nil })
	// The COMMIT goes out beside the publish, in its own goroutine, so on a
	// loaded machine it may reach the server just after the publish: wait
	// until it is the one held by the gate (it cannot get past it).
	testkit.Eventually(t, "the claim's COMMIT waiting for the gate", func() (bool, error) {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event = 'advisory' AND query ILIKE 'commit%')`).Scan(&waiting)
		return waiting, err
	})
	row, err := outbox.Get(ctx, pool, ev.ID)
	if err != nil {
		t.Fatal(err)
	}
	if row.Status != outbox.StatusPending {
		t.Fatalf("status %s before the claim committed, want pending: marked before its lease was durable", row.Status)
	}
	select {
	case res := <-done:
		t.Fatalf("RunOnce returned %+v before the claim's COMMIT", res)
	case <-time.After(50 * time.Millisecond):
	}
	if _, err := gate.Exec(ctx, `SELECT pg_advisory_unlock(4242)`); err != nil {
		t.Fatal(err)
	}
	if res := <-done; res.Published != 1 || res.Lost != 0 {
		t.Fatalf("result %+v, want 1 published", res)
	}
	if row, _ := outbox.Get(ctx, pool, ev.ID); row.Status != outbox.StatusPublished {
		t.Fatalf("status %s after the COMMIT, want published", row.Status)
	}
}

// A claim whose COMMIT fails leaves its events pending and unleased, marks
// nothing, and the next claim publishes them again: a duplicate, never a
// loss.
func TestRelayClaimThatDoesNotCommitMarksNothing(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	ev := bulkInsert(t, pool, "refused", 1, 1)[0]
	if _, err := pool.Exec(ctx, commitGate+`; INSERT INTO refuse_claim_commit VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	log := &pubLog{}
	clk := newClock()
	r, err := outbox.NewRelay(pool, &memPublisher{name: "r", log: log}, outbox.RelayConfig{DisableListen: true, Now: clk.Now}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.RunOnce(ctx)
	if err == nil {
		t.Fatalf("RunOnce = %+v with the claim's COMMIT refused, want its error", res)
	}
	if len(log.all()) != 1 || res.Published != 0 {
		t.Fatalf("%d publishes, result %+v: want the event published once and nothing marked", len(log.all()), res)
	}
	row, err := outbox.Get(ctx, pool, ev.ID)
	if err != nil {
		t.Fatal(err)
	}
	if row.Status != outbox.StatusPending || row.InFlight(clk.Now()) || row.Attempts != 0 {
		t.Fatalf("row = status %s, in flight %v, attempts %d: want pending, unleased, untouched", row.Status, row.InFlight(clk.Now()), row.Attempts)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM refuse_claim_commit`); err != nil {
		t.Fatal(err)
	}
	if res, err := r.RunOnce(ctx); err != nil || res.Published != 1 {
		t.Fatalf("second RunOnce = %+v, %v: want the event published again and marked", res, err)
	}
	if got := log.all(); len(got) != 2 || got[0].Msg.ID != got[1].Msg.ID {
		t.Fatalf("publishes %+v, want the same event twice", got)
	}
}
