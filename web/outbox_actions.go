package web

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/views"
)

// outboxAction is one single action on an outbox event: POST
// /outbox/{id}/{name}.
type outboxAction struct {
	name   string // route segment and form name
	audit  string // audit action and metric label
	reason bool   // a reason is required
	done   string // the notice after it succeeded
	run    func(ctx context.Context, q db.Querier, id uuid.UUID, expected, reason string) (outbox.Change, error)
}

var (
	actionRetry = outboxAction{name: "retry", audit: "outbox.retry", done: "Retried: the event is pending again and will be published in its aggregate's order.",
		run: func(ctx context.Context, q db.Querier, id uuid.UUID, expected, _ string) (outbox.Change, error) {
			return outbox.Retry(ctx, q, id, expected)
		}}
	actionRetryNow = outboxAction{name: "retry-now", audit: "outbox.retry_now", done: "Retry now: the event's backoff is cleared; a relay takes it on its next claim.",
		run: func(ctx context.Context, q db.Querier, id uuid.UUID, expected, _ string) (outbox.Change, error) {
			return outbox.RetryNow(ctx, q, id, expected)
		}}
	actionDeadLetter = outboxAction{name: "dead-letter", audit: "outbox.dead_letter", reason: true,
		done: "Dead-lettered: no relay publishes it until an operator retries it.", run: outbox.DeadLetter}
	actionDiscard = outboxAction{name: "discard", audit: "outbox.discard", reason: true,
		done: "Discarded: the event will never be published; its aggregate's later events flow.", run: outbox.Discard}
	outboxActions = []outboxAction{actionRetry, actionRetryNow, actionDeadLetter, actionDiscard}
)

// doneNotice is the notice of ?done=name after a redirect (a fixed text per
// action: the query never reaches the page).
func doneNotice(name string) string {
	for _, a := range outboxActions {
		if a.name == name {
			return a.done
		}
	}
	return ""
}

// maxReason bounds an action's reason (characters).
const maxReason = 1000

// actionForm is an action's request, parsed (STYLE.md 17).
type actionForm struct {
	id       uuid.UUID
	expected string
	reason   string
	// reasonError is the reason field's error; the action is not attempted.
	reasonError string
}

func parseActionForm(c echo.Context, act outboxAction) (actionForm, error) {
	id, err := eventID(c)
	if err != nil {
		return actionForm{}, err
	}
	f := actionForm{id: id, expected: c.FormValue("expected"), reason: strings.TrimSpace(c.FormValue("reason"))}
	switch f.expected {
	case outbox.StatusPending, outbox.StatusDead, outbox.StatusPublished, outbox.StatusDiscarded:
	default:
		return f, badRequest("The form did not say which state the event was in when you saw it; reload the event and try again.")
	}
	switch {
	case act.reason && f.reason == "":
		f.reasonError = "Say why: a reason is required, and it is kept in the audit trail."
	case utf8.RuneCountInString(f.reason) > maxReason:
		f.reasonError = "The reason is too long (at most 1000 characters)."
	case !utf8.ValidString(f.reason) || strings.ContainsRune(f.reason, 0):
		f.reasonError = "The reason contains characters that cannot be stored."
	}
	return f, nil
}

// handleOutboxAction runs act: in one READ COMMITTED transaction the
// compare-and-set action and its audit row (invariant 11: a rollback leaves
// neither). A stale expectation answers 409 with the event as it is now;
// that attempt, a refused form and a failure are audited in their own
// transaction (nothing changed), so every attempt leaves one row.
func (a *App) handleOutboxAction(act outboxAction) echo.HandlerFunc {
	return func(c echo.Context) error {
		f, err := parseActionForm(c, act)
		if err != nil {
			return err
		}
		ctx := c.Request().Context()
		sess := auth.SessionFrom(c)
		ev := a.actionEvent(c, sess, act, f)
		if f.reasonError != "" {
			a.auditAttempt(ctx, ev, "invalid", nil)
			return a.renderEvent(c, http.StatusUnprocessableEntity, f.id, func(d *views.EventData) {
				d.Action, d.ReasonError, d.Reason = act.name, f.reasonError, f.reason
			})
		}
		err = db.WithTx(ctx, a.pool, func(tx pgx.Tx) error {
			ch, err := act.run(ctx, tx, f.id, f.expected, f.reason)
			if err != nil {
				return err
			}
			ok := ev
			ok.Outcome, ok.Before, ok.After = audit.OutcomeOK, stateJSON(ch.Before), stateJSON(ch.After)
			return audit.Record(ctx, tx, ok)
		})
		var conflict *outbox.ConflictError
		switch {
		case err == nil:
			a.metrics.actions.WithLabelValues(act.audit, "ok").Inc()
			a.pokeLive(ctx)
			if c.Request().Header.Get("HX-Request") != "" {
				return a.renderEventBody(c, f.id, act.done)
			}
			return c.Redirect(http.StatusSeeOther, "/outbox/"+f.id.String()+"?done="+act.name)
		case errors.As(err, &conflict):
			a.auditAttempt(ctx, ev, "conflict", stateJSON(conflict.Current))
			return a.renderEvent(c, http.StatusConflict, f.id, func(d *views.EventData) {
				d.Conflict = conflictText(act, f.expected, conflict.Current)
			})
		case errors.Is(err, outbox.ErrNotFound):
			a.auditAttempt(ctx, ev, "not_found", nil)
			return err
		case errors.Is(err, outbox.ErrInvalidAction):
			a.auditAttempt(ctx, ev, "invalid", nil)
			return a.renderEvent(c, http.StatusUnprocessableEntity, f.id, func(d *views.EventData) {
				d.Problem = "This action does not apply to a " + f.expected + " event. Nothing was changed."
			})
		default:
			a.auditAttempt(ctx, ev, "error", nil)
			return err
		}
	}
}

// actionEvent is the audit row of an attempt, without its outcome.
func (a *App) actionEvent(c echo.Context, sess *auth.Session, act outboxAction, f actionForm) audit.Event {
	meta := requestMeta(c)
	return audit.Event{
		ActorIss: sess.Issuer, ActorSub: sess.Subject, ActorName: sess.Name, ActorRoles: sess.RoleNames(),
		SessionHash: sess.HashHex(), Action: act.audit, TargetType: auditTargetOutbox, TargetID: f.id.String(),
		Reason: f.reason, RequestID: meta.RequestID, IP: meta.IP, UserAgent: meta.UserAgent,
	}
}

// auditAttempt records an attempt that changed nothing (outcome error with
// code: conflict, invalid, not_found, error) in its own transaction, and
// counts it. A cancelled request still leaves its trace.
func (a *App) auditAttempt(ctx context.Context, ev audit.Event, code string, current json.RawMessage) {
	a.metrics.actions.WithLabelValues(ev.Action, code).Inc()
	ev.Outcome, ev.ErrorCode, ev.Before = audit.OutcomeError, code, current
	actx := context.WithoutCancel(ctx)
	if err := db.WithTx(actx, a.pool, func(tx pgx.Tx) error { return audit.Record(actx, tx, ev) }); err != nil {
		a.log.Error("audit of a failed outbox action failed", "action", ev.Action, "target", ev.TargetID, "code", code, "err", err)
	}
}

// auditDenied records ev as refused by a rule of the action itself (not a
// permission the route checks), with code saying which, and counts it.
func (a *App) auditDenied(ctx context.Context, ev audit.Event, code string) error {
	a.metrics.actions.WithLabelValues(ev.Action, audit.OutcomeDenied).Inc()
	ev.Outcome, ev.ErrorCode = audit.OutcomeDenied, code
	actx := context.WithoutCancel(ctx)
	return db.WithTx(actx, a.pool, func(tx pgx.Tx) error { return audit.Record(actx, tx, ev) })
}

// stateJSON is an action's before or after for the audit row: status,
// attempts, availability and reasons; never payload, headers or error text.
func stateJSON(s outbox.State) json.RawMessage {
	b, _ := json.Marshal(s) // plain fields: Marshal cannot fail
	return b
}

func conflictText(act outboxAction, expected string, cur outbox.State) string {
	now := cur.Status
	if cur.InFlight {
		now = "pending and in flight (a relay is publishing it)"
	}
	return "Someone else acted first: you saw this event " + expected + ", it is now " + now +
		". Your " + strings.ReplaceAll(act.name, "-", " ") + " was not applied; nothing was changed. The page shows the event as it is now."
}

// renderEvent renders the detail page with status after an action that
// changed nothing, adjusted by set.
func (a *App) renderEvent(c echo.Context, status int, id uuid.UUID, set func(*views.EventData)) error {
	d, err := a.eventData(c.Request().Context(), c, id)
	if err != nil {
		return err
	}
	set(&d)
	p := a.page(c, "Event "+views.ShortID(id.String()), "/outbox")
	p.URL = "/outbox/" + id.String()
	if c.Request().Header.Get("HX-Request") != "" {
		return render(c, status, views.EventBody(p, d))
	}
	return render(c, status, views.EventPage(p, d))
}

// renderEventBody answers an htmx action with the updated detail fragment.
func (a *App) renderEventBody(c echo.Context, id uuid.UUID, notice string) error {
	d, err := a.eventData(c.Request().Context(), c, id)
	if err != nil {
		return err
	}
	d.Notice = notice
	return render(c, http.StatusOK, views.EventBody(a.page(c, "Event "+views.ShortID(id.String()), "/outbox"), d))
}

// pokeLive wakes the live feeds (this process's and the other replicas')
// after an action committed, so open pages see it before the next tick.
// Best effort: the tick is the fallback.
func (a *App) pokeLive(ctx context.Context) {
	if _, err := a.pool.Exec(context.WithoutCancel(ctx), `SELECT pg_notify($1, '')`, db.OutboxChannel); err != nil {
		a.log.Warn("live wake-up after an action failed", "err", err)
	}
}
