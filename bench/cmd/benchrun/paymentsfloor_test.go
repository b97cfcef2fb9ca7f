package main

import (
	"os"
	"strings"
	"testing"
)

// The ladder's last step is the backlog count's insert trigger as migration
// 00021 writes it, copied here because the bench runs it on tables of its
// own. A change to the migration must reach the copy, or the ladder would
// measure a trigger the product no longer has.
func TestLadderTriggerIsMigration00021s(t *testing.T) {
	b, err := os.ReadFile("../../../internal/db/migrations/00021_outbox_backlog_counts.sql")
	if err != nil {
		t.Fatalf("read the product's migration (run from bench/cmd/benchrun, as go test does): %v", err)
	}
	step := floorLadder[len(floorLadder)-1].SQL
	for _, part := range []struct{ from, to string }{
		{"CREATE FUNCTION outbox_backlog_count_insert()", "$$;"},
		{"CREATE TRIGGER outbox_backlog_count_insert", ";"},
	} {
		want := between(t, string(b), part.from, part.to)
		if got := between(t, step, part.from, part.to); got != want {
			t.Errorf("the ladder's %q differs from migration 00021's:\n got %s\nwant %s", part.from, got, want)
		}
	}
}

// between is s from the first from to the next to after it, its whitespace
// runs made single spaces.
func between(t *testing.T, s, from, to string) string {
	t.Helper()
	i := strings.Index(s, from)
	if i < 0 {
		t.Fatalf("%q not found", from)
	}
	j := strings.Index(s[i+len(from):], to)
	if j < 0 {
		t.Fatalf("%q not found after %q", to, from)
	}
	return strings.Join(strings.Fields(s[i:i+len(from)+j+len(to)]), " ")
}
