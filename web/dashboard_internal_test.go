package web

import (
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/views"
)

// The sparklines say how much history they draw: a console started four
// minutes ago must not claim an hour.
func TestSparklineSpanFollowsHistory(t *testing.T) {
	t.Parallel()
	at := func(d time.Duration) live.Snapshot {
		return live.Snapshot{At: time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC).Add(d)}
	}
	cases := []struct {
		hist []live.Snapshot
		want string
	}{
		{nil, "since start"},
		{[]live.Snapshot{at(0)}, "since start"},
		{[]live.Snapshot{at(0), at(2 * time.Minute), at(4 * time.Minute)}, "last 4m00s"},
		{[]live.Snapshot{at(0), at(time.Hour)}, "last hour"},
	}
	for _, c := range cases {
		d := dashboardData(live.Snapshot{}, true, c.hist, views.Thresholds{})
		for _, s := range d.Sparks {
			if s.Span != c.want {
				t.Errorf("%d snapshots: %s span = %q, want %q", len(c.hist), s.Label, s.Span, c.want)
			}
		}
	}
}
