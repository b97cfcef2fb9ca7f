package web

import (
	"errors"
	"testing"

	"github.com/sluice-dev/sluice/internal/db"
)

// A first page without a next one is the whole list: its rows are the
// header's count and no count runs (a filter that matches nothing is the
// one a count cannot stop early on). Any other page counts.
func TestListTotalCountsOnlyBeyondTheFirstPage(t *testing.T) {
	t.Parallel()
	counted := 0
	count := func() (db.Total, error) {
		counted++
		return db.Total{N: 20_000, Estimate: true}, nil
	}
	if got, err := listTotal(true, 7, "", count); err != nil || got != (db.Total{N: 7}) || counted != 0 {
		t.Fatalf("the whole list on one page: %+v (%v), %d counts", got, err, counted)
	}
	if got, err := listTotal(true, 0, "", count); err != nil || got != (db.Total{}) || counted != 0 {
		t.Fatalf("nothing matches: %+v (%v), %d counts", got, err, counted)
	}
	for _, c := range []struct {
		first bool
		next  string
	}{{true, "cursor"}, {false, ""}, {false, "cursor"}} {
		if got, err := listTotal(c.first, 50, c.next, count); err != nil || got.N != 20_000 {
			t.Fatalf("first %v, next %q: %+v (%v), want the count", c.first, c.next, got, err)
		}
	}
	if counted != 3 {
		t.Fatalf("%d counts, want 3", counted)
	}
	boom := errors.New("boom")
	if _, err := listTotal(false, 50, "", func() (db.Total, error) { return db.Total{}, boom }); !errors.Is(err, boom) {
		t.Fatalf("a count's error: %v", err)
	}
}
