package views

import (
	"fmt"
	"testing"
)

// A support engineer compares the sparkline's "now" with the tile beside
// it: past 120 points the line is downsampled to bucket maxima, but "now"
// must still be the newest value.
func TestSparkNowIsTheNewestValueAfterDownsampling(t *testing.T) {
	values := make([]float64, 3600)
	for i := range values {
		values[i] = float64(i % 50)
	}
	values[len(values)-1] = 3
	sp := NewSpark("Backlog", "spark-backlog", "backlog", values, func(v float64) string { return fmt.Sprint(v) })
	if sp.Now != "3" {
		t.Errorf("now = %s, want 3 (the newest value)", sp.Now)
	}
	if sp.Max != "49" {
		t.Errorf("max = %s, want 49", sp.Max)
	}
}
