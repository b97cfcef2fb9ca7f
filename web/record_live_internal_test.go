package web

import (
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/payments"
)

// The compare logic: what an event's or a payment's page hears, in its
// words, and nothing when nothing it shows moved.
func TestRecordChangesSayWhatMoved(t *testing.T) {
	t.Parallel()
	published := time.Date(2026, 12, 5, 9, 0, 0, 123456000, time.UTC)
	later := published.Add(time.Minute)
	dead := outbox.EventState{Status: outbox.StatusDead, Attempts: 3, LastError: "0badcafe"}
	pending := outbox.EventState{Status: outbox.StatusPending, Attempts: 3, LastError: "0badcafe"}
	for _, c := range []struct {
		name     string
		was, now outbox.EventState
		want     []string
	}{
		{"nothing", dead, dead, nil},
		{"retried", dead, outbox.EventState{Status: outbox.StatusPending}, []string{"status dead → pending", "attempts 3 → 0", "its last error was cleared"}},
		{"one more attempt", pending, outbox.EventState{Status: outbox.StatusPending, Attempts: 4, LastError: "12345678"}, []string{"attempts 3 → 4", "a new last error"}},
		{"taken by a relay", pending, outbox.EventState{Status: outbox.StatusPending, Attempts: 3, LastError: "0badcafe", InFlight: true}, []string{"a relay is publishing it (in flight)"}},
		{"its lease ended", outbox.EventState{Status: outbox.StatusPending, InFlight: true}, outbox.EventState{Status: outbox.StatusPending}, []string{"no longer in flight"}},
		{"published", outbox.EventState{Status: outbox.StatusPending, InFlight: true}, outbox.EventState{Status: outbox.StatusPublished, Attempts: 1, PublishedAt: &published},
			[]string{"published", "attempts 0 → 1"}},
		{"discarded", dead, outbox.EventState{Status: outbox.StatusDiscarded, Attempts: 3, LastError: "0badcafe"}, []string{"discarded"}},
		{"published again", outbox.EventState{Status: outbox.StatusPublished, PublishedAt: &published}, outbox.EventState{Status: outbox.StatusPublished, PublishedAt: &later},
			[]string{"published again"}},
		{"the same publication to the microsecond", outbox.EventState{Status: outbox.StatusPublished, PublishedAt: &published},
			outbox.EventState{Status: outbox.StatusPublished, PublishedAt: new(published.Truncate(time.Microsecond))}, nil},
	} {
		if got := eventChanges(c.was, c.now); !slices.Equal(got, c.want) {
			t.Errorf("event %s: %q, want %q", c.name, got, c.want)
		}
	}

	unknown := payments.PaymentState{Status: payments.StatusUnknown}
	for _, c := range []struct {
		name     string
		was, now payments.PaymentState
		want     []string
	}{
		{"nothing", unknown, unknown, nil},
		{"resolved by a colleague", unknown, payments.PaymentState{Status: payments.StatusCompleted, Resolver: payments.ResolverOperator},
			[]string{"status unknown → completed", "resolved by an operator"}},
		{"settled by the inquiry", unknown, payments.PaymentState{Status: payments.StatusFailed, Resolver: payments.ResolverInquiry},
			[]string{"status unknown → failed", "resolved by the provider's answer to an inquiry"}},
		{"a request made", unknown, payments.PaymentState{Status: payments.StatusUnknown, Approval: 7, ApprovalState: "pending"},
			[]string{"a four-eyes request awaits approval"}},
		{"the request approved", payments.PaymentState{Status: payments.StatusUnknown, Approval: 7, ApprovalState: "pending"},
			payments.PaymentState{Status: payments.StatusCompleted, Resolver: payments.ResolverApproved, Approval: 7, ApprovalState: "approved"},
			[]string{"status unknown → completed", "resolved by an operator, approved by a second", "the four-eyes request was approved"}},
		{"a request made and rejected between two reads", payments.PaymentState{Status: payments.StatusUnknown, Approval: 7, ApprovalState: "rejected"},
			payments.PaymentState{Status: payments.StatusUnknown, Approval: 9, ApprovalState: "rejected"},
			[]string{"a four-eyes request was made and rejected"}},
	} {
		if got := paymentChanges(c.was, c.now); !slices.Equal(got, c.want) {
			t.Errorf("payment %s: %q, want %q", c.name, got, c.want)
		}
	}
}

// A mark survives its trip through the URL, and the watch built from a
// page's own URL pushes a notice once per change, nothing for a state read
// before the page, and, when the record returns to the page's state after
// a change, a notice that says so (the page missed what happened).
func TestRecordWatchFromThePagesURL(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	published := at.Add(-time.Hour).Truncate(time.Microsecond)
	for _, s := range []outbox.EventState{
		{Status: outbox.StatusDead, Attempts: 12, LastError: outbox.ErrorDigest(new("nats: timeout"))},
		{Status: outbox.StatusPublished, Attempts: 1, PublishedAt: &published},
		{Status: outbox.StatusPending, InFlight: true},
	} {
		got, ok := parseEventMark(eventMark(s))
		if !ok || got.Status != s.Status || got.Attempts != s.Attempts || got.InFlight != s.InFlight || got.LastError != s.LastError || !sameMicro(got.PublishedAt, s.PublishedAt) {
			t.Errorf("event mark %q reads %+v (%v), want %+v", eventMark(s), got, ok, s)
		}
	}
	for _, s := range []payments.PaymentState{
		{Status: payments.StatusUnknown},
		{Status: payments.StatusCompleted, Resolver: payments.ResolverApproved, Approval: 12, ApprovalState: "approved"},
	} {
		if got, ok := parsePaymentMark(paymentMark(s)); !ok || got != s {
			t.Errorf("payment mark %q reads %+v (%v), want %+v", paymentMark(s), got, ok, s)
		}
	}

	id := uuid.Must(uuid.NewV7())
	page := payments.PaymentState{OperationID: id, Status: payments.StatusUnknown}
	u := recordWatchURL(live.Watch{Kind: live.KindPayment, ID: id}, paymentMark(page), at)
	q, err := url.ParseQuery(strings.SplitN(u, "?", 2)[1])
	if err != nil {
		t.Fatal(err)
	}
	w := newRecordWatch(q)
	if w == nil || w.w != (live.Watch{Kind: live.KindPayment, ID: id}) {
		t.Fatalf("no watch of the payment from its page's URL %s", u)
	}
	resolved := page
	resolved.Status, resolved.Resolver = payments.StatusCompleted, payments.ResolverOperator
	check := func(name string, s live.RecordState, want string) {
		t.Helper()
		b, err := w.check(s)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case want == "" && b != nil:
			t.Errorf("%s: pushed %s, want nothing", name, b)
		case want != "" && !strings.Contains(string(b), want):
			t.Errorf("%s: pushed %q, want %q", name, b, want)
		}
	}
	check("the page's own state", live.RecordState{At: at, Found: true, Payment: page}, "")
	check("a state read before the page", live.RecordState{At: at.Add(-time.Second), Found: true, Payment: resolved}, "")
	check("resolved", live.RecordState{At: at.Add(time.Second), Found: true, Payment: resolved},
		"This payment changed since this page loaded</strong>: status unknown → completed, resolved by an operator.")
	check("resolved, read again", live.RecordState{At: at.Add(2 * time.Second), Found: true, Payment: resolved}, "")
	check("back to the page's state", live.RecordState{At: at.Add(3 * time.Second), Found: true, Payment: page}, "changed meanwhile and is back to what this page shows")
	check("back, read again", live.RecordState{At: at.Add(3500 * time.Millisecond), Found: true, Payment: page}, "")
	b, _ := w.check(live.RecordState{At: at.Add(4 * time.Second), Found: true, Payment: resolved})
	if !strings.Contains(string(b), `hx-swap-oob="true"`) || !strings.Contains(string(b), `role="status"`) || !strings.Contains(string(b), `data-testid="reload"`) {
		t.Errorf("the notice is not an out-of-band status with a reload link: %s", b)
	}

	ev := uuid.Must(uuid.NewV7())
	gone := newRecordWatch(url.Values{"page": {live.PageRecord}, "kind": {live.KindEvent}, "id": {ev.String()},
		"since": {eventMark(outbox.EventState{Status: outbox.StatusPublished, PublishedAt: &published})}, "at": {"1"}})
	if b, _ := gone.check(live.RecordState{At: at, Found: false}); !strings.Contains(string(b), "This event changed since this page loaded</strong>: it is no longer kept") {
		t.Errorf("a pruned event: %s", b)
	}
}

// A hostile, stale or oversized mark watches nothing: the socket's query
// is read into no watch, and nothing panics.
func TestHostileRecordMarksWatchNothing(t *testing.T) {
	t.Parallel()
	id := uuid.Must(uuid.NewV7()).String()
	ok := url.Values{"page": {live.PageRecord}, "kind": {live.KindEvent}, "id": {id}, "since": {"dead.3.0.0badcafe.-"}, "at": {"1733389200000000"}}
	if newRecordWatch(ok) == nil {
		t.Fatal("a good query watches nothing")
	}
	with := func(k, v string) url.Values {
		q := url.Values{}
		for key, vs := range ok {
			q[key] = slices.Clone(vs)
		}
		q.Set(k, v)
		return q
	}
	for name, q := range map[string]url.Values{
		"oversized mark":           with("since", "dead.3.0.0badcafe."+strings.Repeat("9", 10000)),
		"unknown status":           with("since", "gone.3.0.0badcafe.-"),
		"negative attempts":        with("since", "dead.-1.0.0badcafe.-"),
		"huge attempts":            with("since", "dead.99999999999.0.0badcafe.-"),
		"markup in the digest":     with("since", "dead.3.0.<script>.-"),
		"uppercase digest":         with("since", "dead.3.0.0BADCAFE.-"),
		"a flag not 0 or 1":        with("since", "dead.3.2.0badcafe.-"),
		"published at zero":        with("since", "published.1.0.-.0"),
		"a part too many":          with("since", "dead.3.0.0badcafe.-.x"),
		"empty mark":               with("since", ""),
		"a payment's mark":         with("since", "unknown.-.0.-"),
		"unknown kind":             with("kind", "audit"),
		"id not a UUID":            with("id", "1 OR 1=1"),
		"id in another form":       with("id", "{"+id+"}"),
		"no time":                  with("at", ""),
		"time not a number":        with("at", "yesterday"),
		"payment: unknown state":   with("kind", live.KindPayment),
		"payment: state without a": {"kind": {live.KindPayment}, "id": {id}, "since": {"unknown.-.0.pending"}, "at": {"1"}},
		"payment: resolver words":  {"kind": {live.KindPayment}, "id": {id}, "since": {"completed.<b>.0.-"}, "at": {"1"}},
		"payment: negative id":     {"kind": {live.KindPayment}, "id": {id}, "since": {"unknown.-.-4.pending"}, "at": {"1"}},
	} {
		if w := newRecordWatch(q); w != nil {
			t.Errorf("%s: watches %+v", name, w)
		}
	}
}
