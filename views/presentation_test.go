package views

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/a-h/templ"
	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/payments"
)

// render renders c and parses it for the assertions.
func render(t *testing.T, c templ.Component) *goquery.Document {
	t.Helper()
	var b strings.Builder
	if err := c.Render(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	d, err := goquery.NewDocumentFromReader(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// squash is an element's text with its runs of whitespace made one space,
// as a browser shows it.
func squash(s *goquery.Selection) string { return strings.Join(strings.Fields(s.Text()), " ") }

var at = time.Date(2026, 12, 7, 16, 4, 48, 0, time.UTC)

// Times in tables are <time data-local>, shown in the browser's zone with
// its name: no column header may say "(UTC)". The audit filter, which
// does take UTC, says so and that the list's times are local.
func TestColumnHeadersOfLocalTimesNameNoZone(t *testing.T) {
	pages := map[string]templ.Component{
		"audit list": AuditList(Page{}, AuditListData{Rows: []audit.ListRow{{Seq: 1, OccurredAt: at}}}),
		"payment": PaymentPage(Page{}, PaymentData{ReadAt: at, Ledger: []payments.LedgerEntry{{CreatedAt: at}},
			Calls: []payments.ProviderCall{{StartedAt: at}}, Events: []outbox.ListRow{{ID: uuid.New(), CreatedAt: at}},
			Audit: []audit.Entry{{OccurredAt: at}}, SeeAudit: true}),
		"event": EventPage(Page{}, EventData{E: outbox.EventDetail{Row: outbox.Row{ID: uuid.New()}}, Audit: []audit.Entry{{OccurredAt: at}}, SeeAudit: true}),
	}
	for name, c := range pages {
		d := render(t, c)
		if d.Find("td time[data-local]").Length() == 0 {
			t.Errorf("%s: no localized time in a table; the check is void", name)
		}
		d.Find("th").Each(func(_ int, th *goquery.Selection) {
			if strings.Contains(th.Text(), "UTC") {
				t.Errorf("%s: column header %q names UTC, but its times are shown in the browser's zone", name, th.Text())
			}
		})
	}
	d := render(t, AuditList(Page{}, AuditListData{}))
	if got := d.Find(`[data-testid="filters"] label`).Text(); !strings.Contains(got, "From (UTC)") || !strings.Contains(got, "Before (UTC)") {
		t.Errorf("the audit filter's time inputs no longer say they take UTC: %q", got)
	}
	if got := squash(d.Find(`[data-testid="f-time-hint"]`)); !strings.Contains(got, "take UTC") || !strings.Contains(got, "your time zone") {
		t.Errorf("audit filter hint %q, want it to say the filter takes UTC and the list shows local times", got)
	}
}

// templ drops the whitespace between text and an element or a component:
// the sentences around a <time> or a copy button keep their spaces, and
// the dashboard says "Paused" once.
func TestSpacesAroundTimesAndButtons(t *testing.T) {
	p := outbox.TopicPause{Topic: "orders", PausedBy: "oncall", PausedAt: at, Reason: "consumer migration"}
	now := at.Add(3 * time.Minute)
	if got, want := squash(render(t, PausedNote(p, now)).Find(`[data-testid="topic-paused"]`)),
		"Paused by oncall at 2026-12-07 16:04:48 UTC (3m00s ago) — consumer migration"; got != want {
		t.Errorf("dashboard note %q, want %q", got, want)
	}
	d := render(t, TopicControls(Page{}, TopicControlsData{Paused: []outbox.TopicPause{p}, Now: now}))
	if got, want := squash(d.Find(`[data-testid="paused-by"]`)), "paused by oncall at 2026-12-07 16:04:48 UTC (3m00s ago)"; got != want {
		t.Errorf("outbox topic panel %q, want %q", got, want)
	}
	d = render(t, AuditEntry(Page{}, AuditEntryData{E: audit.Stored{Event: audit.Event{TargetType: "payment", TargetID: "0193-5a4"}},
		TargetURL: "/payments/0193-5a4", HistoryURL: "/audit?target_type=payment&target_id=0193-5a4"}))
	if got, want := squash(d.Find(`[data-testid="target"]`)), "payment / 0193-5a4 · open it · its audit history"; got != want {
		t.Errorf("audit row's target %q, want %q", got, want)
	}
}

// A count of one takes the singular.
func TestListCountsTakeTheSingularForOne(t *testing.T) {
	one := db.Total{N: 1}
	for _, c := range []struct {
		name string
		page templ.Component
		want string
	}{
		{"audit", AuditList(Page{}, AuditListData{Counted: true, Total: one}), "1 row"},
		{"outbox", OutboxList(Page{}, OutboxListData{Counted: true, Total: one}), "1 event"},
		{"payments", PaymentList(Page{}, PaymentListData{Counted: true, Total: one}), "1 payment:"},
		{"audit, many", AuditList(Page{}, AuditListData{Counted: true, Total: db.Total{N: 1234}}), "1,234 rows"},
	} {
		if got := squash(render(t, c.page).Find(`[data-testid="count"]`)); !strings.HasPrefix(got, c.want) || strings.HasPrefix(got, "1 rows") ||
			strings.HasPrefix(got, "1 events") || strings.HasPrefix(got, "1 payments") {
			t.Errorf("%s: count %q, want it to start %q", c.name, got, c.want)
		}
	}
	chain := AuditChainStatus{LastVerified: &audit.Verification{State: audit.VerificationIntact, Checked: 1, RequestedBy: "auditor"},
		Latest: &audit.Verification{State: audit.VerificationRunning, Checked: 1, RequestedBy: "auditor"}}
	d := render(t, AuditChain(chain, false))
	if got := squash(d.Find(`[data-testid="chain-status"]`)); !strings.Contains(got, "(1 row up to seq") {
		t.Errorf("chain status %q, want 1 row", got)
	}
	if got := squash(d.Find(`[data-testid="chain-running"]`)); !strings.Contains(got, "1 row checked so far") {
		t.Errorf("running verification %q, want 1 row", got)
	}
}

// The payments list says how the list it shows is ordered: the whole
// list's segments, or the one status's order alone.
func TestPaymentsListDescribesItsOwnOrder(t *testing.T) {
	for status, want := range map[string]string{
		"":           "unknown first, the longest unknown on top; then processing, failed and completed, each newest first",
		"unknown":    "the longest unknown on top",
		"processing": "newest first",
		"completed":  "newest first",
	} {
		d := render(t, PaymentList(Page{}, PaymentListData{Form: PaymentFilterForm{Status: status}, Counted: true, Total: db.Total{N: 3}}))
		if got := squash(d.Find(`[data-testid="order"]`)); got != want {
			t.Errorf("status %q: order %q, want %q", status, got, want)
		}
	}
}

// A bulk action's filter names the status its action implies when the
// filter names none: a retry touches dead events only.
func TestFilterWordsNameTheActionsStatus(t *testing.T) {
	for _, c := range []struct {
		kind string
		f    outbox.Filter
		want string
	}{
		{outbox.JobRetry, outbox.Filter{Topic: "sluice.orders"}, `dead events on topic "sluice.orders"`},
		{outbox.JobDiscard, outbox.Filter{}, "dead events"},
		{outbox.JobDeadLetter, outbox.Filter{Topic: "t", EventType: "x.v1"}, `pending events on topic "t", of type "x.v1"`},
		{outbox.JobDeadLetter, outbox.Filter{Status: outbox.FilterHeldDead}, "events held behind a dead letter"},
		{outbox.JobReplay, outbox.Filter{AggregateType: "payment", AggregateID: "p1"}, `published events of aggregate type "payment" and id "p1"`},
		{outbox.JobRetry, outbox.Filter{Status: outbox.StatusDead, IDPrefix: "0193"}, `dead events whose id starts with "0193"`},
	} {
		got := FilterWords(c.kind, c.f)
		if got != c.want {
			t.Errorf("%s %+v: %q, want %q", c.kind, c.f, got, c.want)
		}
		if strings.Contains(got, "any status") {
			t.Errorf("%s %+v: %q says any status", c.kind, c.f, got)
		}
	}
}

// The payments pages are not live: each says when it was read and that a
// reload shows newer states, as the inbox and relays pages do.
func TestPaymentPagesSayWhenTheyWereRead(t *testing.T) {
	for name, c := range map[string]templ.Component{
		"list":    PaymentList(Page{}, PaymentListData{ReadAt: at}),
		"payment": PaymentPage(Page{}, PaymentData{ReadAt: at}),
	} {
		d := render(t, c)
		note := d.Find(`[data-testid="as-of"]`)
		if got := squash(note); !strings.HasPrefix(got, "as of 2026-12-07 16:04:48 UTC · reload for") {
			t.Errorf("%s: note %q, want \"as of <time> · reload for …\"", name, got)
		}
		if dt, _ := note.Find("time[data-local]").Attr("datetime"); dt != Datetime(at) {
			t.Errorf("%s: the note's time is %q, want a localized <time> of the read", name, dt)
		}
	}
}

// The actions that give an event up are set apart from Retry: a reviewer
// found Discard in the same blue beside it.
func TestGivingUpActionsLookDestructive(t *testing.T) {
	dead := render(t, EventPage(Page{}, EventData{CanAct: true, E: outbox.EventDetail{Row: outbox.Row{ID: uuid.New(), Status: "dead"}}}))
	pending := render(t, EventPage(Page{}, EventData{CanAct: true, E: outbox.EventDetail{Row: outbox.Row{ID: uuid.New(), Status: "pending"}}}))
	for _, c := range []struct {
		d           *goquery.Document
		sel         string
		destructive bool
	}{
		{dead, `[data-testid="action-discard"]`, true},
		{dead, `[data-testid="action-retry"]`, false},
		{pending, `[data-testid="action-dead-letter"]`, true},
	} {
		b := c.d.Find(c.sel)
		if b.Length() != 1 {
			t.Fatalf("%s: %d buttons", c.sel, b.Length())
		}
		if b.HasClass("destructive") != c.destructive {
			t.Errorf("%s: destructive %v, want %v", c.sel, b.HasClass("destructive"), c.destructive)
		}
	}
}

// The bulk form's time bounds have the list filter's date and time picker,
// and a value the picker cannot show stays in a text box rather than being
// dropped from a filter that acts on every event it matches.
func TestBulkFormTimeBoundsUseThePickerAndKeepOtherValues(t *testing.T) {
	d := render(t, BulkForm(Page{}, BulkFormData{Values: BulkValues{CreatedFrom: "2025-01-31T14:00", CreatedTo: "2025-02-01"}}))
	from, to := d.Find(`[data-testid="bulk-created_from"]`), d.Find(`[data-testid="bulk-created_to"]`)
	if from.AttrOr("type", "") != "datetime-local" || from.AttrOr("value", "") != "2025-01-31T14:00" {
		t.Errorf("created_from: type %q value %q, want the picker with the value", from.AttrOr("type", ""), from.AttrOr("value", ""))
	}
	if to.AttrOr("type", "") != "text" || to.AttrOr("value", "") != "2025-02-01" {
		t.Errorf("created_to: type %q value %q, want a text box keeping the date", to.AttrOr("type", ""), to.AttrOr("value", ""))
	}
}

// While events are held behind dead letters, the oldest pending age may be
// theirs: the tile says so rather than raise what reads as a second,
// unexplained alarm.
func TestOldestPendingSaysHeldEventsCount(t *testing.T) {
	hint := func(held int64) string {
		d := render(t, Tiles(DashboardData{Ready: true, Snap: live.Snapshot{Held: outbox.Held{Events: held}}}, false))
		return squash(d.Find(`[data-testid="oldest-pending"]`).Closest(".tile"))
	}
	if h := hint(3); !strings.Contains(h, "held behind dead letters included") {
		t.Errorf("with 3 held: %q", h)
	}
	if h := hint(0); strings.Contains(h, "held") {
		t.Errorf("with none held: %q", h)
	}
}

// While the database does not answer, the dashboard's time line says so and
// that the figures are from before; they must not pass for current ones.
func TestUpdatedSaysTheFiguresAreFromBeforeAnOutage(t *testing.T) {
	at := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	d := DashboardData{Ready: true, Snap: live.Snapshot{At: at}}
	if got := squash(render(t, Updated(d, true)).Find(`[data-testid="updated"]`)); !strings.HasPrefix(got, "as of") {
		t.Fatalf("while it answers: %q", got)
	}
	d.Snap.Unreachable = at.Add(5 * time.Second)
	p := render(t, Updated(d, true)).Find(`[data-testid="updated"]`)
	if got := squash(p); !strings.Contains(got, "The console has not been able to read its figures since") || !strings.Contains(got, "before it") || p.AttrOr("role", "") != "alert" {
		t.Fatalf("during an outage: %q (role %q)", got, p.AttrOr("role", ""))
	}
}
