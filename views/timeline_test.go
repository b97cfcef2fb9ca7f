package views

import (
	"slices"
	"testing"

	"github.com/sluice-dev/sluice/internal/audit"
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
