package web

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/views"
)

// The detail pages' live notice: what changed in the record the page shows.
// An event's or a payment's page puts the state it rendered (its mark) in
// its /ws URL; the socket watches that record (live.Feed.SubscribeRecord),
// the feed reads every watched record's state once per tick in one
// statement, and the socket compares the newest with its page's mark (no
// query) and, when they differ, pushes a small notice saying how
// ("status unknown → completed", "attempts 3 → 4"). The page is not
// re-rendered: a form half filled in (a reason, evidence) is never lost.
// The notice is about the record alone, never the rest of the outbox; the
// outbox list keeps its outbox-wide notice (outbox_live.go).

// maxMark bounds a mark read from a URL: the longest real one is about 60
// characters; anything longer is no mark.
const maxMark = 100

// maxAttempts bounds the attempts a mark may carry (the column is an int).
const maxAttempts = 1 << 31

// recordWatchURL is the /ws URL of a detail page showing the record w,
// whose state it read at at (database clock) as mark.
func recordWatchURL(w live.Watch, mark string, at time.Time) string {
	return "/ws?" + url.Values{"page": {live.PageRecord}, "kind": {w.Kind}, "id": {w.ID.String()},
		"since": {mark}, "at": {strconv.FormatInt(at.UnixMicro(), 10)}}.Encode()
}

// eventMark is an event's watched state as its page's URL carries it:
// status.attempts.inflight.error.published (in flight 1 or 0, the error's
// digest or "-", published_at in Unix microseconds or "-"). The error's
// text never travels: its digest tells a new error from the same one.
func eventMark(s outbox.EventState) string {
	inFlight, errDigest, published := "0", "-", "-"
	if s.InFlight {
		inFlight = "1"
	}
	if s.LastError != "" {
		errDigest = s.LastError
	}
	if s.PublishedAt != nil {
		published = strconv.FormatInt(s.PublishedAt.UnixMicro(), 10)
	}
	return strings.Join([]string{s.Status, strconv.Itoa(s.Attempts), inFlight, errDigest, published}, ".")
}

// parseEventMark reads an event's mark; anything else is no mark.
func parseEventMark(m string) (outbox.EventState, bool) {
	parts := strings.Split(m, ".")
	if len(m) > maxMark || len(parts) != 5 {
		return outbox.EventState{}, false
	}
	var s outbox.EventState
	switch parts[0] {
	case outbox.StatusPending, outbox.StatusPublished, outbox.StatusDead, outbox.StatusDiscarded:
		s.Status = parts[0]
	default:
		return outbox.EventState{}, false
	}
	n, err := strconv.Atoi(parts[1])
	if err != nil || n < 0 || n >= maxAttempts {
		return outbox.EventState{}, false
	}
	s.Attempts = n
	switch parts[2] {
	case "1":
		s.InFlight = true
	case "0":
	default:
		return outbox.EventState{}, false
	}
	if parts[3] != "-" {
		if !isHex(parts[3], 8) {
			return outbox.EventState{}, false
		}
		s.LastError = parts[3]
	}
	if parts[4] != "-" {
		us, err := strconv.ParseInt(parts[4], 10, 64)
		if err != nil || us <= 0 {
			return outbox.EventState{}, false
		}
		t := time.UnixMicro(us)
		s.PublishedAt = &t
	}
	return s, true
}

// paymentMark is a payment's watched state as its page's URL carries it:
// status.resolver.approval.state ("-" for no resolver or request). No
// customer data, amount or staff id: only what PaymentState keeps.
func paymentMark(s payments.PaymentState) string {
	resolver, state := "-", "-"
	if s.Resolver != "" {
		resolver = s.Resolver
	}
	if s.ApprovalState != "" {
		state = s.ApprovalState
	}
	return strings.Join([]string{string(s.Status), resolver, strconv.FormatInt(s.Approval, 10), state}, ".")
}

// parsePaymentMark reads a payment's mark; anything else is no mark.
func parsePaymentMark(m string) (payments.PaymentState, bool) {
	parts := strings.Split(m, ".")
	if len(m) > maxMark || len(parts) != 4 {
		return payments.PaymentState{}, false
	}
	var s payments.PaymentState
	switch st := payments.Status(parts[0]); st {
	case payments.StatusProcessing, payments.StatusCompleted, payments.StatusFailed, payments.StatusUnknown:
		s.Status = st
	default:
		return payments.PaymentState{}, false
	}
	switch parts[1] {
	case "-":
	case payments.ResolverOperator, payments.ResolverApproved, payments.ResolverSettlement, payments.ResolverInquiry, payments.ResolverOther:
		s.Resolver = parts[1]
	default:
		return payments.PaymentState{}, false
	}
	id, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil || id < 0 {
		return payments.PaymentState{}, false
	}
	s.Approval = id
	switch parts[3] {
	case "-":
	case "pending", "approved", "rejected":
		s.ApprovalState = parts[3]
	default:
		return payments.PaymentState{}, false
	}
	if (s.Approval == 0) != (s.ApprovalState == "") {
		return payments.PaymentState{}, false
	}
	return s, true
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// recordWatch is one socket's view of its page's record.
type recordWatch struct {
	w       live.Watch
	event   outbox.EventState     // the page's, for live.KindEvent
	payment payments.PaymentState // the page's, for live.KindPayment
	at      time.Time             // when the page read it (database clock)
	shown   string                // the changes last pushed, one per line
}

// newRecordWatch reads a detail page's socket query: the record and the
// page's mark. nil when it names none, or anything in it does not parse
// (a hostile or stale URL watches nothing; the socket stays harmless).
func newRecordWatch(q url.Values) *recordWatch {
	raw := q.Get("id")
	id, err := uuid.Parse(raw)
	if err != nil || len(raw) != 36 {
		return nil
	}
	at, err := strconv.ParseInt(q.Get("at"), 10, 64)
	if err != nil || at <= 0 {
		return nil
	}
	rw := &recordWatch{w: live.Watch{Kind: q.Get("kind"), ID: id}, at: time.UnixMicro(at)}
	var ok bool
	switch rw.w.Kind {
	case live.KindEvent:
		rw.event, ok = parseEventMark(q.Get("since"))
	case live.KindPayment:
		rw.payment, ok = parsePaymentMark(q.Get("since"))
	}
	if !ok {
		return nil
	}
	return rw
}

// check compares the record's newest state with the page's and returns the
// notice to push, or nil when what the notice says has not changed since
// the last push. A record back to the page's state after a change keeps a
// notice that says so: an event retried, then dead again with as many
// attempts, reads as the page shows, yet the page no longer tells its
// story (a drill saw the notice clear, and a discard could go on from a
// page that had missed the retry).
func (w *recordWatch) check(s live.RecordState) ([]byte, error) {
	if s.At.Before(w.at) {
		// Read before the page: comparing it would report the page's own
		// state (or an older one) as a change.
		return nil, nil
	}
	var lines []string
	what := "event"
	switch {
	case w.w.Kind == live.KindPayment:
		what = "payment"
		if lines = []string{"it is no longer found"}; s.Found {
			lines = paymentChanges(w.payment, s.Payment)
		}
	case !s.Found:
		lines = []string{"it is no longer kept (pruned after its retention)"}
	default:
		lines = eventChanges(w.event, s.Event)
	}
	if len(lines) == 0 && w.shown != "" {
		lines = []string{"it changed meanwhile and is back to what this page shows; its history says what happened in between"}
	}
	key := strings.Join(lines, "\n")
	if key == w.shown {
		return nil, nil
	}
	w.shown = key
	var buf bytes.Buffer
	if err := views.RecordChanged(views.RecordNotice{What: what, Lines: lines, OOB: true}).Render(context.Background(), &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// eventChanges says how an event moved from the page's state to now's, in
// the words of its page; nothing when it did not.
func eventChanges(was, now outbox.EventState) []string {
	var lines []string
	switch {
	case was.Status != now.Status && (now.Status == outbox.StatusPublished || now.Status == outbox.StatusDiscarded):
		lines = append(lines, now.Status)
	case was.Status != now.Status:
		lines = append(lines, fmt.Sprintf("status %s → %s", was.Status, now.Status))
	case now.Status == outbox.StatusPublished && !sameMicro(was.PublishedAt, now.PublishedAt):
		lines = append(lines, "published again") // replayed, then published
	}
	if was.Attempts != now.Attempts {
		lines = append(lines, fmt.Sprintf("attempts %s → %s", views.Count(int64(was.Attempts)), views.Count(int64(now.Attempts))))
	}
	// The lease matters while the event waits: a relay holding it hides
	// its actions. Its end with a publication or a death says nothing more.
	if now.Status == outbox.StatusPending && was.InFlight != now.InFlight {
		if now.InFlight {
			lines = append(lines, "a relay is publishing it (in flight)")
		} else {
			lines = append(lines, "no longer in flight")
		}
	}
	if was.LastError != now.LastError {
		if now.LastError == "" {
			lines = append(lines, "its last error was cleared")
		} else {
			lines = append(lines, "a new last error")
		}
	}
	return lines
}

func sameMicro(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.UnixMicro() == b.UnixMicro()
}

// resolverWords says who resolved a payment (payments.ResolverOf's kinds),
// with no name: a socket pushes no staff or customer data.
var resolverWords = map[string]string{
	payments.ResolverOperator:   "resolved by an operator",
	payments.ResolverApproved:   "resolved by an operator, approved by a second",
	payments.ResolverSettlement: "resolved by a settlement file",
	payments.ResolverInquiry:    "resolved by the provider's answer to an inquiry",
	payments.ResolverOther:      "resolved",
}

// paymentChanges says how a payment moved from the page's state to now's;
// nothing when it did not.
func paymentChanges(was, now payments.PaymentState) []string {
	var lines []string
	if was.Status != now.Status {
		lines = append(lines, fmt.Sprintf("status %s → %s", was.Status, now.Status))
	}
	if was.Resolver != now.Resolver && now.Resolver != "" {
		lines = append(lines, resolverWords[now.Resolver])
	}
	switch {
	case now.Approval == 0 || (was.Approval == now.Approval && was.ApprovalState == now.ApprovalState):
	case was.Approval != now.Approval && now.ApprovalState == "pending":
		lines = append(lines, "a four-eyes request awaits approval")
	case was.Approval != now.Approval:
		lines = append(lines, "a four-eyes request was made and "+now.ApprovalState)
	default:
		lines = append(lines, "the four-eyes request was "+now.ApprovalState)
	}
	return lines
}

// recordNotice is the notice to push after a feed message, if the socket
// watches a record and what it would say changed.
func (a *App) recordNotice(c *live.Client, w *recordWatch) []byte {
	if w == nil {
		return nil
	}
	s, ok := a.feed.Record(c)
	if !ok {
		return nil
	}
	b, err := w.check(s)
	if err != nil {
		a.log.Error("render the record notice", "err", err)
		return nil
	}
	return b
}
