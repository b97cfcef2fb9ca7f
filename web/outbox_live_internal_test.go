package web

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// A page's mark carries whether its held count was a lower bound, so the
// notice says "1,000+" as the tile did, and a page loaded before marks had
// the flag still parses.
func TestOutboxMarkCarriesAPartialHeldCount(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	page := live.Snapshot{At: at, Dead: 999, Held: outbox.Held{Events: 999, Aggregates: 999}}
	m := markOf(page, false)
	if got, ok := parseMark(m.String()); !ok || got != m {
		t.Fatalf("mark %q parses as %+v (%v), want %+v", m.String(), got, ok, m)
	}
	partial := markOf(live.Snapshot{Held: outbox.Held{Events: 1000, Aggregates: 1000, Partial: true}}, false)
	if got, ok := parseMark(partial.String()); !ok || !got.heldPartial || got.held != 1000 || !strings.Contains(partial.String(), ".1000+.") {
		t.Fatalf("partial mark %q parses as %+v (%v)", partial.String(), got, ok)
	}
	if got, ok := parseMark("3.12.abcdef01"); !ok || got.held != 12 || got.heldPartial {
		t.Fatalf("a mark without the flag parses as %+v (%v)", got, ok)
	}
	if _, ok := parseMark("3.12++.abcdef01"); ok {
		t.Fatal("a mark with two flags parsed")
	}

	q, err := url.ParseQuery(strings.SplitN(watchURL(page, false), "?", 2)[1])
	if err != nil {
		t.Fatal(err)
	}
	w := newOutboxWatch(q)
	if w == nil {
		t.Fatal("no watch from the page's own /ws URL")
	}
	now := page
	now.At = at.Add(time.Second)
	now.Dead = 1001
	now.Held = outbox.Held{Events: 1000, Aggregates: 1000, Partial: true}
	b, err := w.check(now)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "held behind dead letters 999 → 1,000+") {
		t.Fatalf("notice %s, want the held count as a lower bound", b)
	}
	if b, err := w.check(now); err != nil || b != nil {
		t.Fatalf("the same snapshot again: notice %s (%v)", b, err)
	}
}
