package views

import (
	"slices"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// The event's timeline puts the attempts after the last retry or replay,
// which restarted them, and the actions taken since after the attempts; a
// refused action is not on it. Entries come newest first, as the page
// reads them.
func TestTimelineSplitsActionsAtTheLastRetry(t *testing.T) {
	words := func(acts []audit.Entry) []string {
		var out []string
		for _, a := range acts {
			out = append(out, actionWords(a))
		}
		return out
	}
	entry := func(action, outcome string) audit.Entry { return audit.Entry{Action: action, Outcome: outcome} }
	for _, c := range []struct {
		entries       []audit.Entry
		before, after []string
		line          string
	}{
		{nil, nil, nil, "3 publish attempts"},
		{[]audit.Entry{entry("outbox.dead_letter", audit.OutcomeOK)}, nil, []string{"dead letter"}, "3 publish attempts"},
		{
			[]audit.Entry{
				entry("outbox.dead_letter", audit.OutcomeOK), entry("outbox.retry", audit.OutcomeDenied),
				entry("outbox.retry", audit.OutcomeOK), entry("outbox.retry_now", audit.OutcomeOK),
			},
			[]string{"retry now", "retry"}, []string{"dead letter"}, "3 publish attempts since the last retry",
		},
		// A replay restarts the attempts too (a bulk job's, read from its
		// chunk row): its attempts come after it, not before.
		{
			[]audit.Entry{entry("outbox.replay", audit.OutcomeOK), entry("outbox.retry", audit.OutcomeOK)},
			[]string{"retry", "replay"}, nil, "3 publish attempts since the last replay",
		},
	} {
		if got := words(actionsUpToLastRetry(c.entries)); !slices.Equal(got, c.before) {
			t.Errorf("%v: before the attempts %q, want %q", c.entries, got, c.before)
		}
		if got := words(actionsAfterLastRetry(c.entries)); !slices.Equal(got, c.after) {
			t.Errorf("%v: after the attempts %q, want %q", c.entries, got, c.after)
		}
		if got := attemptsLine(3, c.entries); got != c.line {
			t.Errorf("%v: attempts line %q, want %q", c.entries, got, c.line)
		}
	}
}

// After the attempts, the actions and the states the row records read in
// time order: a reviewer saw "discard by oncall 20:24:08" above
// "dead 20:17:44". A state an action caused follows it even when its clock
// read a moment earlier.
func TestTimelineAfterTheAttemptsIsInTimeOrder(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.TimeOnly, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	ptr := func(s string) *time.Time { v := at(s); return &v }
	act := func(action, when string) audit.Entry {
		return audit.Entry{Action: action, Outcome: audit.OutcomeOK, OccurredAt: at(when)}
	}
	lines := func(steps []timelineStep) []string {
		var out []string
		for _, s := range steps {
			if s.action != nil {
				out = append(out, actionWords(*s.action))
			} else {
				out = append(out, s.state)
			}
		}
		return out
	}
	for _, c := range []struct {
		name    string
		e       outbox.EventDetail
		entries []audit.Entry // newest first, as the page reads them
		want    []string
	}{
		{"discarded after it died", outbox.EventDetail{Row: outbox.Row{DeadAt: ptr("20:17:44"), DiscardedAt: ptr("20:24:08")}},
			[]audit.Entry{act("outbox.discard", "20:24:08")}, []string{"dead", "discard", "discarded"}},
		{"a dead letter's state read a moment before its audit row", outbox.EventDetail{Row: outbox.Row{DeadAt: ptr("20:17:44")}},
			[]audit.Entry{act("outbox.dead_letter", "20:17:45")}, []string{"dead letter", "dead"}},
		{"paused topic, then published", outbox.EventDetail{Row: outbox.Row{PublishedAt: ptr("10:00:05")}},
			[]audit.Entry{act("outbox.retry_now", "10:00:09"), act("outbox.dead_letter", "09:59:00"), act("outbox.retry", "09:58:00")},
			[]string{"dead letter", "published", "retry now"}},
	} {
		if got := lines(stepsAfterLastRetry(c.e, c.entries)); !slices.Equal(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
