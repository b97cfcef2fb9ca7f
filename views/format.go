// Package views holds the console's templ components: the layout, the pages
// and the fragments that the pages and the websocket pushes share.
package views

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/db"
)

// htmxConfig turns off everything htmx could evaluate and keeps requests on
// this origin.
const htmxConfig = `{"allowEval":false,"allowScriptTags":false,"selfRequestsOnly":true,"includeIndicatorStyles":false,"historyCacheSize":0,"wsReconnectDelay":"full-jitter"}`

func csrfHeaders(token string) string {
	b, _ := json.Marshal(map[string]string{"X-CSRF-Token": token})
	return string(b)
}

// Age formats a duration compactly: 0s, 42s, 3m05s, 2h10m, 3d4h.
func Age(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	s := int64(d.Round(time.Second) / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	case s < 86400:
		return fmt.Sprintf("%dh%02dm", s/3600, (s%3600)/60)
	}
	return fmt.Sprintf("%dd%dh", s/86400, (s%86400)/3600)
}

// CountOf is n with its noun, singular for exactly one: "1 attempt",
// TotalText is TotalOf as plain text, for a sentence or a button: "1,234",
// "more than 10,000", "more than 10,000 (≈ 195k)" or "≈ 195k".
func TotalText(t db.Total) string {
	switch {
	case t.MoreThan > 0 && t.N > t.MoreThan+1:
		return "more than " + Count(t.MoreThan) + " (≈ " + Approx(t.N) + ")"
	case t.MoreThan > 0:
		return "more than " + Count(t.MoreThan)
	case t.Estimate:
		return "≈ " + Approx(t.N)
	}
	return Count(t.N)
}

// "12,345 attempts".
func CountOf(n int64, one, many string) string {
	return Count(n) + " " + Plural(n, one, many)
}

// Plural is the noun for n things, for a number printed apart from it (in
// its own element): one for exactly one, many otherwise.
func Plural(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// AndList joins words as a sentence does: "a", "a and b", "a, b and c".
func AndList(words []string) string {
	switch len(words) {
	case 0:
		return ""
	case 1:
		return words[0]
	}
	return strings.Join(words[:len(words)-1], ", ") + " and " + words[len(words)-1]
}

// Count formats a count with thin grouping.
func Count(n int64) string {
	if n < 0 {
		return "-" + Count(-n)
	}
	s := fmt.Sprint(n)
	out := make([]byte, 0, len(s)+len(s)/3)
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// Rate formats events per second.
func Rate(r float64) string {
	switch {
	case r <= 0 || math.IsNaN(r):
		return "0"
	case r < 10:
		return fmt.Sprintf("%.1f", r)
	}
	return Count(int64(math.Round(r)))
}

// Spark is a server-rendered sparkline: SVG polyline points over a fixed
// box, the newest value at the right, with its axes labelled (Top and
// Bottom on y, From and "now" on x) and, where the number has one, the
// warning threshold drawn.
type Spark struct {
	Label  string
	TestID string
	Now    string
	Max    string // the largest value drawn
	Points string
	Class  string
	Span   string // how much history the line covers, e.g. "last 4m00s"
	From   string // the x axis' left end, e.g. "4m00s ago"
	Top    string // the y axis' top: the larger of Max and the threshold
	Bottom string // the y axis' bottom (zero)
	Warn   string // the warning threshold, formatted; "" when there is none
	WarnY  string // its height in the box's coordinates
}

const sparkW, sparkH = 240.0, 40.0

// NewSpark scales values into the sparkline box, from zero to the maximum.
func NewSpark(label, testID, class string, values []float64, format func(float64) string) Spark {
	return newSpark(label, testID, class, values, format, 0)
}

// NewSparkWarn is NewSpark with the warning threshold the tile beside it
// uses (Thresholds) drawn as a line. The scale reaches the threshold, so
// the line is always in view and a quiet hour reads as far below it.
func NewSparkWarn(label, testID, class string, values []float64, format func(float64) string, warn float64) Spark {
	return newSpark(label, testID, class, values, format, warn)
}

func newSpark(label, testID, class string, values []float64, format func(float64) string, warn float64) Spark {
	sp := Spark{Label: label, TestID: testID, Class: class, Now: format(0), Max: format(0), Bottom: format(0)}
	top := math.Max(warn, 0)
	if warn > 0 {
		sp.Warn = format(warn)
	}
	// "now" is the newest snapshot itself, taken before downsampling: the
	// last bucket's maximum would disagree with the tile beside it.
	if len(values) > 0 {
		sp.Now = format(values[len(values)-1])
	}
	values = downsample(values, 120)
	maxV := 0.0
	for _, v := range values {
		maxV = math.Max(maxV, v)
	}
	sp.Max = format(maxV)
	top = math.Max(top, maxV)
	sp.Top = format(top)
	y := func(v float64) float64 {
		if top <= 0 {
			return sparkH - 1
		}
		return sparkH - 1 - (v/top)*(sparkH-2)
	}
	if warn > 0 {
		sp.WarnY = fmt.Sprintf("%.1f", y(warn))
	}
	if len(values) == 0 {
		return sp
	}
	step := sparkW
	if len(values) > 1 {
		step = sparkW / float64(len(values)-1)
	}
	buf := make([]byte, 0, len(values)*12)
	for i, v := range values {
		x := float64(i) * step
		if len(values) == 1 {
			x = sparkW
		}
		buf = fmt.Appendf(buf, "%.1f,%.1f ", x, y(v))
	}
	sp.Points = string(buf)
	return sp
}

// downsample keeps at most n points, each the maximum of its bucket, so a
// spike in an hour of one-second ticks still shows.
func downsample(v []float64, n int) []float64 {
	if len(v) <= n {
		return v
	}
	out := make([]float64, n)
	for i := range out {
		lo, hi := i*len(v)/n, (i+1)*len(v)/n
		m := v[lo]
		for _, x := range v[lo:hi] {
			m = math.Max(m, x)
		}
		out[i] = m
	}
	return out
}

// ListTitle is a list page's title with its filter ("Outbox: status
// dead"), so tabs and history entries of one list tell its filters apart;
// a long filter is cut (a title is read in a tab).
func ListTitle(page, filter string) string {
	if filter == "" {
		return page
	}
	if r := []rune(filter); len(r) > 60 {
		filter = string(r[:59]) + "…"
	}
	return page + ": " + filter
}

// ShortID is an id's last 12 characters, for a title: the ends of our
// UUIDs differ (version 7 ids made together share their start).
func ShortID(id string) string { return short(id) }

// short is the tail of an id, enough to tell rows apart on screen (the head
// of a UUIDv7 is its timestamp, shared by ids made in the same millisecond).
func short(id string) string {
	if len(id) > 12 {
		return "…" + id[len(id)-12:]
	}
	return id
}

// UTCText is how the console prints an instant where no script runs and in
// a <time>'s title: UTC to the second, "2026-12-03 16:32:22 UTC".
func UTCText(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05") + " UTC" }

// UTCTextMs is UTCText to the millisecond, for steps a few milliseconds
// apart (provider calls, audit rows).
func UTCTextMs(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000") + " UTC" }

// Datetime is a <time>'s machine-readable instant: RFC 3339 in UTC with
// the full precision the database kept, which console.js localizes.
func Datetime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// sparkLabel reads a sparkline out for a screen reader.
func sparkLabel(s Spark) string {
	l := s.Label + ", " + s.Span + ", now " + s.Now + ", max " + s.Max
	if s.Warn != "" {
		l += ", warning at " + s.Warn
	}
	return l
}

// CallProblem says in words why a provider call got no answer, from the
// error the service recorded (payment_provider_call.error). The recorded
// text is the Go client's ("provider: outcome unknown: Post
// "http://…/v1/charges": context deadline exceeded"): the page shows what
// it means and keeps the text itself in the title, for whoever debugs.
func CallProblem(err string) string {
	has := func(s ...string) bool {
		for _, x := range s {
			if strings.Contains(err, x) {
				return true
			}
		}
		return false
	}
	sent := "sent: outcome unknown"
	if strings.HasPrefix(err, "provider: request not processed") {
		sent = "not processed"
	}
	switch {
	case has("nothing of the request was written"):
		return "the connection was dead before the request was sent: not processed"
	case has("deadline exceeded", "Client.Timeout", "i/o timeout"):
		return "timed out waiting for the answer (PROVIDER_TIMEOUT): " + sent
	case has("connection refused"):
		return "connection refused: the provider was not listening: not processed"
	case has("(503)"):
		return "provider unavailable (503): " + sent
	case has("provider answered "):
		code, _, _ := strings.Cut(err[strings.Index(err, "provider answered ")+len("provider answered "):], " ")
		return "answered HTTP " + code + ", not the provider's protocol: " + sent
	case has("connection reset", "EOF", "broken pipe", "server closed"):
		return "the connection was cut before the answer: " + sent
	case has("undecodable answer", "status \"", "not the provider's own answer"):
		return "an answer that is not the provider's protocol: " + sent
	case has("charge answered"):
		return "the provider did not know the outcome: " + sent
	}
	return "no usable answer: " + sent
}
