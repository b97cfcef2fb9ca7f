package views

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/inbox"
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

// A <time> printed without scripts reads in UTC, whatever zone the
// server's clock carries; its datetime keeps the full precision.
func TestUTCTextAndDatetime(t *testing.T) {
	tokyo := time.FixedZone("JST", 9*3600)
	at := time.Date(2026, 12, 4, 1, 2, 3, 456789000, tokyo) // 2026-12-03 16:02:03.456789 UTC
	if got := UTCText(at); got != "2026-12-03 16:02:03 UTC" {
		t.Errorf("UTCText = %q", got)
	}
	if got := UTCTextMs(at); got != "2026-12-03 16:02:03.456 UTC" {
		t.Errorf("UTCTextMs = %q", got)
	}
	if got := Datetime(at); got != "2026-12-03T16:02:03.456789Z" {
		t.Errorf("Datetime = %q", got)
	}
	var b strings.Builder
	if err := Time(at).Render(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	if want := `<time datetime="2026-12-03T16:02:03.456789Z" title="2026-12-03 16:02:03 UTC" data-local>2026-12-03 16:02:03 UTC</time>`; b.String() != want {
		t.Errorf("Time renders %s, want %s", b.String(), want)
	}
}

// The reconcile-age sparkline draws the dashboard's warning threshold: the
// scale reaches it when the values stay below, so the line is in view, and
// the axis labels say where the scale starts and ends.
func TestSparkWarnThresholdAndAxis(t *testing.T) {
	age := func(v float64) string { return fmt.Sprintf("%.0fs", v) }
	sp := NewSparkWarn("Reconcile age", "spark-reconcile", "age", []float64{0, 10, 30}, age, 60)
	if sp.Warn != "60s" || sp.Top != "60s" || sp.Bottom != "0s" || sp.Max != "30s" {
		t.Errorf("warn %q top %q bottom %q max %q, want 60s 60s 0s 30s", sp.Warn, sp.Top, sp.Bottom, sp.Max)
	}
	// 60 at the top of the 40-high box (1 unit margin), the newest value
	// (30, half the scale) halfway down.
	if sp.WarnY != "1.0" {
		t.Errorf("threshold at y=%s, want 1.0 (the top)", sp.WarnY)
	}
	if !strings.HasSuffix(strings.TrimSpace(sp.Points), "240.0,20.0") {
		t.Errorf("points %q: the newest value should sit at half height", sp.Points)
	}
	// Above the threshold the values set the scale and the line sits below
	// the top.
	sp = NewSparkWarn("Reconcile age", "spark-reconcile", "age", []float64{120}, age, 60)
	if sp.Top != "120s" || sp.WarnY != "20.0" {
		t.Errorf("top %q threshold y %s, want 120s and 20.0", sp.Top, sp.WarnY)
	}
	// Without a threshold nothing is drawn and the scale is the values'.
	sp = NewSpark("Backlog", "spark-backlog", "backlog", []float64{5, 7}, age)
	if sp.Warn != "" || sp.WarnY != "" || sp.Top != "7s" {
		t.Errorf("no threshold: warn %q y %q top %q", sp.Warn, sp.WarnY, sp.Top)
	}
}

// A count of one takes the singular ("1 attempt", "in 1 aggregate"); any
// other, grouped, the plural.
func TestCountOf(t *testing.T) {
	for n, want := range map[int64]string{0: "0 attempts", 1: "1 attempt", 2: "2 attempts", 12345: "12,345 attempts"} {
		if got := CountOf(n, "attempt", "attempts"); got != want {
			t.Errorf("CountOf(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestAndList(t *testing.T) {
	for _, c := range []struct {
		words []string
		want  string
	}{{nil, ""}, {[]string{"admin"}, "admin"}, {[]string{"operator", "admin"}, "operator and admin"}, {[]string{"a", "b", "c"}, "a, b and c"}} {
		if got := AndList(c.words); got != c.want {
			t.Errorf("AndList(%q) = %q, want %q", c.words, got, c.want)
		}
	}
}

// Each kind of consumer problem in a sentence (inbox page) and in a few
// words (dashboard tile), with shard lists as ranges.
func TestConsumerProblemWords(t *testing.T) {
	at := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	problems := []inbox.Problem{
		{Consumer: "ledger", Kind: inbox.ProblemStopped, SilentLast: at.Add(-3 * time.Minute)},
		{Consumer: "c", Kind: inbox.ProblemMixed, Counts: []int{0, 8, 16}},
		{Consumer: "b", Kind: inbox.ProblemMisread, Counts: []int{0}, Published: []int{16}},
		{Consumer: "a", Kind: inbox.ProblemUnowned, Shards: 16, Unowned: []int{0, 1, 2, 5, 8, 9}},
		{Consumer: "a", Kind: inbox.ProblemUnowned, Shards: 4, Unowned: []int{3}},
	}
	long := ConsumerProblems(at, problems)
	wantLong := []string{
		"ledger: no process runs; the last one stopped reporting 3m00s ago without signing off (killed, its host lost, or cut off from the database). Its events wait until one starts.",
		"c: its running processes read with different shard counts (OUTBOX_SHARDS 0, 8 and 16), each only what is published on its own count's subjects or queues.",
		"b reads with OUTBOX_SHARDS 0, but the running relays publish with OUTBOX_SHARDS 16: it never sees their events there. Give every relay and consumer the same OUTBOX_SHARDS.",
		"a: shards 0–2, 5, 8–9 of 16 may be read by no running process (CONSUME_SHARDS_OWNED): their events wait until a process that owns them starts.",
		"a: shard 3 of 4 may be read by no running process (CONSUME_SHARDS_OWNED): their events wait until a process that owns them starts.",
	}
	wantBrief := []string{
		"ledger: no process runs (last report 3m00s ago)",
		"c: processes on OUTBOX_SHARDS 0, 8 and 16",
		"b reads OUTBOX_SHARDS 0; relays publish on 16",
		"a: shards 0–2, 5, 8–9 of 16 read by no process",
		"a: shard 3 of 4 read by no process",
	}
	for i, p := range problems {
		if long[i] != wantLong[i] {
			t.Errorf("sentence %d:\n got %q\nwant %q", i, long[i], wantLong[i])
		}
		if got := consumerProblemBrief(at, p); got != wantBrief[i] {
			t.Errorf("brief %d:\n got %q\nwant %q", i, got, wantBrief[i])
		}
	}
}

// A provider call's recorded error reads as what it means, with whether
// the charge may have been processed; the Go client's text (a URL, "context
// deadline exceeded") stays out of the sentence.
func TestCallProblemSaysWhatTheErrorMeans(t *testing.T) {
	for _, c := range []struct{ err, want string }{
		{`provider: outcome unknown: Post "http://127.0.0.1:18182/v1/charges": context deadline exceeded`, "timed out waiting for the answer (PROVIDER_TIMEOUT): sent: outcome unknown"},
		{`provider: request not processed: Post "http://x/v1/charges": dial tcp 127.0.0.1:1: connect: connection refused`, "connection refused: the provider was not listening: not processed"},
		{`provider: request not processed: provider unavailable (503)`, "provider unavailable (503): not processed"},
		{`provider: outcome unknown: provider answered 502`, "answered HTTP 502, not the provider's protocol: sent: outcome unknown"},
		{`provider: outcome unknown: Post "http://x/v1/charges": unexpected EOF`, "the connection was cut before the answer: sent: outcome unknown"},
		{`provider: request not processed: nothing of the request was written: Post "http://x": broken pipe`, "the connection was dead before the request was sent: not processed"},
		{`provider: outcome unknown: charge answered "unknown"`, "the provider did not know the outcome: sent: outcome unknown"},
		{`something new`, "no usable answer: sent: outcome unknown"},
	} {
		got := CallProblem(c.err)
		if got != c.want {
			t.Errorf("%s: %q, want %q", c.err, got, c.want)
		}
		if strings.Contains(got, "http") || strings.Contains(got, "deadline") {
			t.Errorf("%q carries the client's text", got)
		}
	}
}

// A list's header says only what is known: a count, "more than" where a
// count stopped (with the planner's figure when it says more), or "≈" for
// the planner's estimate alone.
func TestTotalTextSaysHowTheTotalIsKnown(t *testing.T) {
	for _, c := range []struct {
		t    db.Total
		want string
	}{
		{db.Total{N: 1234}, "1,234"},
		{db.Total{}, "0"},
		{db.Total{N: 195_432, Estimate: true}, "≈ 195k"},
		{db.Total{N: 10_001, Estimate: true, MoreThan: 10_000}, "more than 10,000"},
		{db.Total{N: 195_432, Estimate: true, MoreThan: 10_000}, "more than 10,000 (≈ 195k)"},
	} {
		if got := TotalText(c.t); got != c.want {
			t.Errorf("%+v: %q, want %q", c.t, got, c.want)
		}
	}
	var b strings.Builder
	if err := TotalOf(db.Total{N: 195_432, Estimate: true}, "event", "events").Render(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	if got := b.String(); !strings.Contains(got, "≈ 195k") || !strings.Contains(got, "not a count") || strings.Contains(got, "more than") {
		t.Errorf("an estimate renders %q", got)
	}
	b.Reset()
	if err := TotalOf(db.Total{N: 10_001, Estimate: true, MoreThan: 10_000}, "event", "events").Render(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	if got := b.String(); !strings.Contains(got, "more than 10,000</span> events") || strings.Contains(got, "≈") {
		t.Errorf("a capped count renders %q", got)
	}
}
