package audit_test

import (
	"context"
	"testing"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

func TestForTargetListsOneTargetNewestFirst(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	record(t, pool, 3) // targets "0", "1", "2"
	record(t, pool, 2) // targets "0", "1" again
	got, err := audit.ForTarget(context.Background(), pool, "outbox_event", "1", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Seq <= got[1].Seq {
		t.Fatalf("want target 1's two rows, newest first: %+v", got)
	}
	for _, e := range got {
		if e.Action != "outbox.retry" || e.Outcome != audit.OutcomeOK || e.ActorIss != "https://idp" || len(e.ActorRoles) != 1 ||
			string(e.Before) != `{"a": 1, "status": "dead"}` {
			t.Errorf("row %+v", e)
		}
	}
	if got, err := audit.ForTarget(context.Background(), pool, "outbox_event", "1", 1); err != nil || len(got) != 1 {
		t.Fatalf("limit 1: %d rows, %v", len(got), err)
	}
	if got, err := audit.ForTarget(context.Background(), pool, "payment", "1", 10); err != nil || len(got) != 0 {
		t.Fatalf("another target type: %d rows, %v", len(got), err)
	}
}

// Several targets in one statement: each target's newest rows (at most the
// limit each), target by target in the order asked, none of the others.
func TestForTargetsListsEachTargetInTurn(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	record(t, pool, 3) // targets "0", "1", "2"
	record(t, pool, 2) // targets "0", "1" again
	got, err := audit.ForTargets(context.Background(), pool, "outbox_event", []string{"2", "0", "9"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Seq != 3 || got[1].Seq <= got[2].Seq {
		t.Fatalf("want target 2's row, then target 0's two newest first: %+v", got)
	}
	if got, err := audit.ForTargets(context.Background(), pool, "outbox_event", []string{"0", "1"}, 1); err != nil || len(got) != 2 {
		t.Fatalf("limit 1 each: %d rows, %v", len(got), err)
	}
}
