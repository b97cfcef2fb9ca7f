package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/telemetry"
	"github.com/sluice-dev/sluice/views"
)

// Trace kinds of GET /trace/{kind}/{id}.
const (
	traceKindPayment   = "payment"   // id: an operation id
	traceKindAggregate = "aggregate" // id: aggregate_type:aggregate_id
	traceKindEvent     = "event"     // id: an outbox event id
)

// traceAuditRows bounds the audit rows read per target of a trace.
const traceAuditRows = 50

// traceURL is the trace page of one thing.
func traceURL(kind, id string) string { return "/trace/" + kind + "/" + id }

// aggregateTraceURL is an aggregate's trace page, its type and id escaped.
func aggregateTraceURL(typ, id string) string {
	return traceURL(traceKindAggregate, url.PathEscape(typ+":"+id))
}

// trace is GET /trace/{kind}/{id}: one operation end to end, in time order.
func (a *App) trace(c echo.Context) error {
	kind, raw := c.Param("kind"), c.Param("id")
	if len(raw) > 300 {
		return badRequest("That id is longer than 300 characters.")
	}
	ctx := c.Request().Context()
	b := &traceBuilder{canAudit: a.links.Audit && may(c, auth.PermAudit), seeAudit: may(c, auth.PermAudit), traceURL: a.cfg.TraceURL,
		linkOK: func(link string) bool {
			switch {
			case strings.HasPrefix(link, "/payments/"):
				return a.links.Payment
			case strings.HasPrefix(link, "/outbox/"):
				return a.links.OutboxEvent
			case link == "/inbox":
				return a.links.Inbox
			case link == "/approvals":
				return a.links.Approvals && may(c, auth.PermPaymentsAct)
			case strings.HasPrefix(link, "/jobs/"):
				return a.links.Jobs && may(c, auth.PermOutboxAct)
			}
			return true
		}}
	var err error
	switch kind {
	case traceKindPayment:
		op, perr := uuid.Parse(raw)
		if perr != nil || len(raw) != 36 {
			return badRequest("That is not an operation id: an id is a UUID such as 0190f3a2-7c1e-7d4b-9a51-1f2e3d4c5b6a.")
		}
		b.title, b.subject = "Payment "+op.String(), op.String()
		err = a.tracePayment(ctx, b, op, nil)
	case traceKindAggregate:
		// Aggregate ids are the writers' own strings: the link escapes
		// them (aggregateTraceURL), so read them unescaped.
		if u, perr := url.PathUnescape(raw); perr == nil {
			raw = u
		}
		typ, id, ok := strings.Cut(raw, ":")
		if !ok || typ == "" || id == "" {
			return badRequest("An aggregate is written type:id, for example order:0190f3a2-7c1e-7d4b-9a51-1f2e3d4c5b6a or payment:<operation id>.")
		}
		b.title, b.subject = "Aggregate "+typ+" "+id, id
		err = a.traceAggregate(ctx, b, typ, id)
	case traceKindEvent:
		id, perr := uuid.Parse(raw)
		if perr != nil || len(raw) != 36 {
			return badRequest("That is not an event id: an id is a UUID such as 0190f3a2-7c1e-7d4b-9a51-1f2e3d4c5b6a.")
		}
		b.title, b.subject = "Event "+id.String(), id.String()
		err = a.traceEvent(ctx, b, id)
	default:
		return &publicError{status: http.StatusNotFound,
			msg: "There is no trace of that kind. A trace starts from a payment (/trace/payment/<operation id>), an aggregate (/trace/aggregate/<type>:<id>) or an outbox event (/trace/event/<event id>)."}
	}
	if err != nil {
		return err
	}
	d := b.data(kind, raw)
	if err := a.pool.QueryRow(ctx, `SELECT statement_timestamp()`).Scan(&d.ReadAt); err != nil {
		return err
	}
	return render(c, http.StatusOK, views.TracePage(a.page(c, "Trace of "+b.title, ""), d))
}

// tracePayment adds a payment's business rows, the events of its aggregate
// (only the one of onlyEvent when set) and the audit rows about it.
func (a *App) tracePayment(ctx context.Context, b *traceBuilder, op uuid.UUID, onlyEvent *outbox.Row) error {
	p, err := payments.Get(ctx, a.pool, op)
	if err != nil {
		return err
	}
	times, err := payments.TimesOf(ctx, a.pool, op)
	if err != nil {
		return err
	}
	payURL := "/payments/" + op.String()
	if rec, err := payments.RecordByOperation(ctx, a.pool, op); err == nil {
		b.add(rec.CreatedAt, "api", "API request POST /v1/payments",
			"merchant "+rec.MerchantID+" · idempotency record written ("+string(payments.StatusProcessing)+")", payURL, "Payment")
		if rec.Status != payments.StatusProcessing && times.RecordUpdated != nil {
			b.add(*times.RecordUpdated, "idempotency", "Idempotency record "+string(rec.Status),
				"stored answer: "+storedAnswer(rec.ResponseStatus), payURL, "Payment")
		}
	} else if !errors.Is(err, payments.ErrNotFound) {
		return err
	}
	customer := payments.MaskCustomer(a.kr, p)
	var who []string
	for _, k := range sortedFields(customer) {
		who = append(who, k+" "+customer[k])
	}
	b.add(p.CreatedAt, "payment", "Payment written",
		fmt.Sprintf("%s %s · account %d · invoice %s · %s", p.Amount.StringFixed(2), p.Currency, p.AccountID, p.InvoiceID, strings.Join(who, ", ")),
		payURL, "Payment")
	if times.ReservationCreated != nil {
		b.add(*times.ReservationCreated, "reservation", "Reservation made",
			times.ReservationAmount+" "+p.Currency+" held on account "+strconv.FormatInt(p.AccountID, 10), payURL, "Payment")
		if times.ReservationStatus != "active" && times.ReservationUpdated != nil {
			b.add(*times.ReservationUpdated, "reservation", "Reservation "+times.ReservationStatus, "", payURL, "Payment")
		}
	}
	calls, err := payments.ProviderCalls(ctx, a.pool, op)
	if err != nil {
		return err
	}
	for _, call := range calls {
		answer := "answered " + call.Answer
		if call.Answer == "" {
			answer = "no answer: " + views.CallProblem(call.Error)
		}
		b.add(call.StartedAt, "provider", "Provider "+call.Op, fmt.Sprintf("%s · took %d ms", answer, call.Duration.Milliseconds()), payURL, "Payment")
	}
	ledger, err := payments.LedgerOf(ctx, a.pool, op)
	if err != nil {
		return err
	}
	for _, e := range ledger {
		b.add(e.CreatedAt, "ledger", "Ledger "+e.EntryType,
			fmt.Sprintf("%s %s · account %d · entry %d", e.Amount.StringFixed(2), e.Currency, e.AccountID, e.EntryID), payURL, "Payment")
	}
	if p.UnknownSince != nil {
		b.add(*p.UnknownSince, "payment", "Payment unknown", "the provider's outcome is not known; only evidence moves it", payURL, "Payment")
	}
	approvals, err := payments.ApprovalsOf(ctx, a.pool, op)
	if err != nil {
		return err
	}
	for _, ap := range approvals {
		b.add(ap.RequestedAt, "operator", "Four-eyes request by "+ap.RequesterName, "asks "+string(ap.Outcome)+": "+ap.Reason, "/approvals", "Approvals")
		if ap.DecidedAt != nil {
			b.add(*ap.DecidedAt, "operator", "Four-eyes "+ap.State+" by "+ap.DeciderName, "", "/approvals", "Approvals")
		}
	}
	if p.ResolvedAt != nil {
		names := views.StaffNames{}
		names.AddApprovals(approvals)
		b.add(*p.ResolvedAt, "operator", "Payment resolved by "+views.ResolvedByWhom(p.ResolvedBy),
			"now "+string(p.Status)+" · by "+views.ResolvedBy(p.ResolvedBy, names, ""), payURL, "Payment")
	} else if p.Status != payments.StatusProcessing && p.Status != payments.StatusUnknown {
		b.add(p.UpdatedAt, "payment", "Payment "+string(p.Status), "", payURL, "Payment")
	}
	events := []outbox.Row{}
	if onlyEvent != nil {
		events = append(events, *onlyEvent)
	} else if events, err = outbox.OfAggregate(ctx, a.pool, payments.AggregateType, op.String(), 0); err != nil {
		return err
	}
	if err := a.traceEvents(ctx, b, events); err != nil {
		return err
	}
	return b.addAudit(ctx, a, auditTargetPayment, op.String())
}

// traceAggregate: a payment aggregate is its payment's trace; any other is
// its events.
func (a *App) traceAggregate(ctx context.Context, b *traceBuilder, typ, id string) error {
	if typ == payments.AggregateType {
		if op, err := uuid.Parse(id); err == nil {
			return a.tracePayment(ctx, b, op, nil)
		}
	}
	events, err := outbox.OfAggregate(ctx, a.pool, typ, id, 0)
	if err != nil {
		return err
	}
	if len(events) == 0 {
		return &publicError{status: http.StatusNotFound, msg: "No outbox event of that aggregate is kept (there may never have been one, or its events were pruned after their retention)."}
	}
	return a.traceEvents(ctx, b, events)
}

// traceEvent: one event, with its payment's business rows when it is about
// a payment.
func (a *App) traceEvent(ctx context.Context, b *traceBuilder, id uuid.UUID) error {
	e, err := outbox.Get(ctx, a.pool, id)
	if err != nil {
		return err
	}
	b.aggregate = aggregateTraceURL(e.AggregateType, e.AggregateID)
	if e.AggregateType == payments.AggregateType {
		if op, perr := uuid.Parse(e.AggregateID); perr == nil {
			err := a.tracePayment(ctx, b, op, &e)
			if !errors.Is(err, payments.ErrNotFound) {
				return err
			}
			b.steps = nil // the payment is gone (or never was): the event alone
		}
	}
	return a.traceEvents(ctx, b, []outbox.Row{e})
}

// traceEvents adds each event's life, each consumer's inbox row and effect,
// and the audit rows about the event.
func (a *App) traceEvents(ctx context.Context, b *traceBuilder, events []outbox.Row) error {
	ids := make([]string, 0, len(events))
	for _, e := range events {
		ids = append(ids, e.ID.String())
		url := "/outbox/" + e.ID.String()
		b.add(e.CreatedAt, "event", fmt.Sprintf("Event %s #%d written", e.EventType, e.AggregateSeq),
			fmt.Sprintf("topic %s · now %s · publish attempts: %d", e.Topic, e.Status, e.Attempts), url, "Event")
		if e.DeadAt != nil {
			b.add(*e.DeadAt, "event", "Event dead-lettered", deref(e.DeadReason), url, "Event")
		}
		if e.PublishedAt != nil {
			// published_at is the relay's mark, written after the broker's
			// acknowledgement: a fast consumer's inbox row may come first.
			b.add(*e.PublishedAt, "publish", "Event published (broker acknowledged, relay marked)",
				fmt.Sprintf("%s #%d · publish attempts: %d", e.EventType, e.AggregateSeq, e.Attempts), url, "Event")
		}
		if e.DiscardedAt != nil {
			b.add(*e.DiscardedAt, "event", "Event discarded", deref(e.DiscardReason), url, "Event")
		}
		if tp := e.HeaderMap()["traceparent"]; tp != "" {
			b.addTraceID(tp)
		}
	}
	receipts, err := inbox.ReceiptsOf(ctx, a.pool, ids)
	if err != nil {
		return err
	}
	for _, r := range receipts {
		b.add(r.ProcessedAt, "inbox", "Consumer "+r.Consumer+" inbox row", "message "+short(r.MessageID)+" recorded once", "/inbox", "Inbox")
		if r.EffectAt != nil {
			b.add(*r.EffectAt, "effect", "Consumer "+r.Consumer+" effect applied",
				"message "+short(r.MessageID)+" · "+views.CountOf(int64(r.Effects), "effect row", "effect rows"), "/inbox", "Inbox")
		}
	}
	if err := b.addAudit(ctx, a, auditTargetOutbox, ids...); err != nil {
		return err
	}
	return b.addBulk(ctx, a, ids)
}

// addBulk adds the bulk jobs' actions on the events, once per chunk row
// (one chunk may have changed several of the trace's events).
func (b *traceBuilder) addBulk(ctx context.Context, a *App, ids []string) error {
	bulk, refs, err := a.bulkActions(ctx, true, ids, traceAuditRows) // the links pass linkOK
	if err != nil {
		return err
	}
	seen := map[int64]bool{}
	for _, id := range ids {
		for _, e := range bulk[id] {
			if seen[e.Seq] {
				continue
			}
			seen[e.Seq] = true
			link, text := refs[e.Seq].URL, "Job"
			if b.canAudit {
				link, text = "/audit/"+strconv.FormatInt(e.Seq, 10), "Audit row"
			}
			detail := "outcome " + e.Outcome
			if e.Reason != "" {
				detail += " · reason: " + e.Reason
			}
			b.add(e.OccurredAt, "audit", fmt.Sprintf("Audit #%d %s by %s via bulk job %s", e.Seq, e.Action, e.ActorName, short(refs[e.Seq].Job)),
				detail, link, text)
		}
	}
	return nil
}

// traceBuilder collects a trace's steps; data orders them and measures the
// lags.
type traceBuilder struct {
	title     string
	subject   string // the id the trace is of (the title's), for its copy button
	canAudit  bool   // the user may open the audit pages: steps link to their rows
	seeAudit  bool   // the user may see the audit trail: every row, not only the actions that changed the object
	traceURL  string
	aggregate string                 // the whole aggregate's trace, for an event's page
	linkOK    func(link string) bool // the page exists and the user may open it
	steps     []views.TraceStep
	traceIDs  []views.TraceID
}

func (b *traceBuilder) add(at time.Time, kind, title, detail, link, linkText string) {
	if link != "" && b.linkOK != nil && !b.linkOK(link) {
		link, linkText = "", ""
	}
	b.steps = append(b.steps, views.TraceStep{At: at, Kind: kind, Title: title, Detail: detail, Link: link, LinkText: linkText})
}

// addAudit adds the audit rows about the targets (one statement for all).
func (b *traceBuilder) addAudit(ctx context.Context, a *App, targetType string, targetIDs ...string) error {
	entries, err := audit.ForTargets(ctx, a.pool, targetType, targetIDs, traceAuditRows)
	if err != nil {
		return err
	}
	for _, e := range entries {
		// Who may not see the audit trail (DESIGN.md: auditor and admin
		// may) sees the operation's history: the actions that changed it,
		// not reveals or refused attempts.
		if !b.seeAudit && (e.Outcome != audit.OutcomeOK || !(strings.HasPrefix(e.Action, "outbox.") || strings.HasPrefix(e.Action, "payments."))) {
			continue
		}
		link, text := "", ""
		if b.canAudit {
			link, text = "/audit/"+strconv.FormatInt(e.Seq, 10), "Audit row"
		}
		who := e.ActorName
		if who == "" {
			who = e.ActorSub
		}
		detail := "outcome " + e.Outcome
		if e.Reason != "" {
			detail += " · reason: " + e.Reason
		}
		b.add(e.OccurredAt, "audit", fmt.Sprintf("Audit #%d %s by %s", e.Seq, e.Action, who), detail, link, text)
		// A retry cleared the death it undid from the event's row; its
		// audit row keeps it.
		if dead, ok := views.DiedBefore(e); ok && dead.DeadAt != nil {
			b.add(*dead.DeadAt, "event", "Event dead-lettered (undone by the retry of audit #"+strconv.FormatInt(e.Seq, 10)+")",
				views.CountOf(int64(dead.Attempts), "publish attempt", "publish attempts")+" before · "+dead.DeadReason, link, text)
		}
	}
	return nil
}

func (b *traceBuilder) addTraceID(traceparent string) {
	id, ok := telemetry.TraceIDOf(traceparent)
	if !ok {
		return
	}
	for _, t := range b.traceIDs {
		if t.ID == id {
			return
		}
	}
	t := views.TraceID{ID: id}
	if b.traceURL != "" {
		t.URL = strings.ReplaceAll(b.traceURL, "{trace_id}", id)
	}
	b.traceIDs = append(b.traceIDs, t)
}

// data orders the steps by time (ties keep the order they were added in,
// which is the order of cause and effect) and measures each lag.
func (b *traceBuilder) data(kind, id string) views.TraceData {
	sort.SliceStable(b.steps, func(i, j int) bool { return b.steps[i].At.Before(b.steps[j].At) })
	for i := range b.steps {
		if i > 0 {
			b.steps[i].Lag = b.steps[i].At.Sub(b.steps[i-1].At)
			b.steps[i].HasLag = true
		}
	}
	d := views.TraceData{Kind: kind, ID: id, Title: b.title, Subject: b.subject, Steps: b.steps, TraceIDs: b.traceIDs, Aggregate: b.aggregate}
	if n := len(b.steps); n > 1 {
		d.Span = b.steps[n-1].At.Sub(b.steps[0].At)
	}
	return d
}

func storedAnswer(code int) string {
	if code == 0 {
		return "none yet"
	}
	return "HTTP " + strconv.Itoa(code)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func short(id string) string {
	if len(id) > 13 {
		return id[:8] + "…" + id[len(id)-4:]
	}
	return id
}
