package views

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// Thresholds are the dashboard's warning levels (CONSOLE_WARN_*): a tile
// turns orange at them, not whenever its number is above zero.
type Thresholds struct {
	OldestPending time.Duration
	ReconcileAge  time.Duration
	Dead          int64 // dead letters from which the tile warns
}

// Approx formats a count compactly for an estimate: 12,345 → 12k,
// 1,234,567 → 1.2M.
func Approx(n int64) string {
	switch {
	case n >= 1_000_000_000:
		return fmt.Sprintf("%.1fG", float64(n)/1e9)
	case n >= 1_000_000:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 10_000:
		return fmt.Sprintf("%dk", int64(math.Round(float64(n)/1e3)))
	}
	return Count(n)
}

// Percent formats a ratio in [0, 1] as a percentage with one decimal.
func Percent(r float64) string {
	if math.IsNaN(r) || r < 0 {
		r = 0
	}
	return fmt.Sprintf("%.1f%%", r*100)
}

// PrettyJSON indents a JSON document for reading; text that is not JSON
// comes back as it is. Either way it is text: templ escapes it.
func PrettyJSON(raw []byte) string {
	if len(raw) == 0 {
		return ""
	}
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return string(raw)
	}
	return b.String()
}

// StatusWord is what a list row or a detail page calls an event's state:
// the stored status, or "in flight" / "held" for a pending event under a
// live lease or behind an unfinished earlier event of its aggregate.
func StatusWord(status string, inFlight, held bool) string {
	switch {
	case status == "pending" && inFlight:
		return "in flight"
	case status == "pending" && held:
		return "held"
	}
	return status
}
