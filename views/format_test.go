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

func TestApproxPercentAndPrettyJSON(t *testing.T) {
	for n, want := range map[int64]string{999: "999", 9_999: "9,999", 12_345: "12k", 1_234_567: "1.2M", 3_000_000_000: "3.0G"} {
		if got := Approx(n); got != want {
			t.Errorf("Approx(%d) = %s, want %s", n, got, want)
		}
	}
	if got := Percent(1.0 / 3); got != "33.3%" {
		t.Errorf("Percent = %s", got)
	}
	if got := PrettyJSON([]byte(`{"a":[1,"<b>"]}`)); got != "{\n  \"a\": [\n    1,\n    \"<b>\"\n  ]\n}" {
		t.Errorf("PrettyJSON = %q", got)
	}
	if got := PrettyJSON([]byte(`not json <x>`)); got != "not json <x>" {
		t.Errorf("PrettyJSON of text = %q", got)
	}
}
