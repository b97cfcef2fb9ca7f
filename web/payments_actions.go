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
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/views"
)

// Audit actions of the payments screens.
const (
	actionInquire        = "payments.inquire"
	actionResolve        = "payments.resolve"
	actionResolveRequest = payments.ActionResolveRequest
	actionApprove        = "payments.approve"
	actionReject         = "payments.reject"
)

// errNoProvider: the console has no PROVIDER_URL.
var errNoProvider = &publicError{status: http.StatusServiceUnavailable,
	msg: "This console has no payment provider configured (PROVIDER_URL), so it cannot inquire. The payments service's reconcile worker keeps inquiring on its own."}

// statusJSON is an action's before or after for the audit row: statuses
// and outcome words only, never customer data.
func statusJSON(kv ...string) json.RawMessage {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			m[kv[i]] = kv[i+1]
		}
	}
	b, _ := json.Marshal(m) // strings: Marshal cannot fail
	return b
}

// staffID is the (iss, sub) identity a four-eyes request compares.
func staffID(sess *auth.Session) string { return sess.Issuer + "|" + sess.Subject }

// inquirePayment is POST /payments/{op}/inquire: ask the provider now; a
// definite answer resolves the payment exactly as the reconcile worker
// would (payments.(*Service).Inquire). Audited with the status before and
// after and the answer.
func (a *App) inquirePayment(c echo.Context) error {
	op, err := operationID(c)
	if err != nil {
		return err
	}
	if a.inquirer == nil {
		return errNoProvider
	}
	ctx := c.Request().Context()
	sess := auth.SessionFrom(c)
	ev := a.actorEvent(c, sess, actionInquire, auditTargetPayment, op.String())
	before, err := payments.Get(ctx, a.pool, op)
	if err != nil {
		if errors.Is(err, payments.ErrNotFound) {
			a.auditAttempt(ctx, ev, "not_found", nil)
		}
		return err
	}
	// The audit row commits in the transaction that records the answer
	// (and resolves the payment when the answer is definite).
	rep, err := a.inquirer.InquireRecorded(ctx, op, func(ctx context.Context, tx pgx.Tx, rep payments.InquiryReport) error {
		answer := string(rep.Answer)
		if answer == "" {
			answer = payments.AnswerNone
		}
		ok := ev
		ok.Outcome = audit.OutcomeOK
		ok.Before = statusJSON("status", string(before.Status))
		ok.After = statusJSON("status", string(rep.Status), "answer", answer)
		return audit.Record(ctx, tx, ok)
	})
	if err != nil {
		a.auditAttempt(ctx, ev, "error", statusJSON("status", string(before.Status)))
		return err
	}
	a.metrics.actions.WithLabelValues(actionInquire, audit.OutcomeOK).Inc()
	if rep.Resolved {
		a.pokeLive(ctx)
	}
	return c.Redirect(http.StatusSeeOther, "/payments/"+op.String()+"?done=inquired")
}

// resolveForm is POST /payments/{op}/resolve, parsed (STYLE.md 17).
type resolveForm struct {
	op       uuid.UUID
	outcome  payments.Outcome
	raw      views.ResolveForm
	problems map[string]string // field → what is wrong; nothing is attempted
	// notSeenUnknown: the form did not carry expected=unknown (not our
	// page's form, or an old one): refused as a 400, and audited.
	notSeenUnknown bool
}

func parseResolveForm(c echo.Context) (resolveForm, error) {
	op, err := operationID(c)
	if err != nil {
		return resolveForm{}, err
	}
	f := resolveForm{op: op, problems: map[string]string{}, raw: views.ResolveForm{
		Outcome: c.FormValue("outcome"), Reason: strings.TrimSpace(c.FormValue("reason")), Evidence: strings.TrimSpace(c.FormValue("evidence")),
	}}
	f.notSeenUnknown = c.FormValue("expected") != string(payments.StatusUnknown)
	if f.outcome, err = payments.ParseOutcome(f.raw.Outcome); err != nil {
		f.problems["outcome"] = "Choose succeeded or failed."
	}
	checkText(f.problems, "reason", f.raw.Reason, "Say why: a reason is required, and it is kept in the audit trail.")
	checkText(f.problems, "evidence", f.raw.Evidence, "Name the evidence (a provider ticket, a statement line): it is required and kept in the audit trail.")
	return f, nil
}

// checkText records what is wrong with a required free-text field.
func checkText(problems map[string]string, field, v, missing string) {
	switch {
	case v == "":
		problems[field] = missing
	case utf8.RuneCountInString(v) > maxReason:
		problems[field] = "Too long (at most 1000 characters)."
	case !utf8.ValidString(v) || strings.ContainsRune(v, 0):
		problems[field] = "It contains characters that cannot be stored."
	}
}

// resolvePayment is POST /payments/{op}/resolve. At or below the
// four-eyes threshold: in one READ COMMITTED transaction payments.Resolve
// (compare-and-set from unknown) and the audit row; the relays are poked
// after the commit. Above it: a pending request (and its audit row) that a
// different operator approves. Either needs a recent sign-in. A payment
// that is not unknown any more is a 409, audited as error/conflict.
func (a *App) resolvePayment(c echo.Context) error {
	f, err := parseResolveForm(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	sess := auth.SessionFrom(c)
	if a.loginTooOld(sess) {
		return a.reauthFor(c, sess, "POST /payments/:op/resolve", "/payments/"+f.op.String())
	}
	p, err := payments.Get(ctx, a.pool, f.op)
	if err != nil {
		return err
	}
	fourEyes := p.Amount.GreaterThan(a.cfg.FourEyesAbove)
	action := actionResolve
	if fourEyes {
		action = actionResolveRequest
	}
	ev := a.actorEvent(c, sess, action, auditTargetPayment, f.op.String())
	ev.Reason, ev.Evidence = f.raw.Reason, f.raw.Evidence
	if f.notSeenUnknown {
		a.auditAttempt(ctx, ev, "bad_request", nil)
		return badRequest("The form did not say that the payment was unknown when you saw it; reload the payment and try again.")
	}
	if len(f.problems) > 0 {
		a.auditAttempt(ctx, ev, "invalid", nil)
		return a.renderPayment(c, http.StatusUnprocessableEntity, f.op, func(d *views.PaymentData) {
			d.Form, d.FieldErrors = f.raw, f.problems
		})
	}
	done := "resolved"
	err = db.WithTx(ctx, a.pool, func(tx pgx.Tx) error {
		ok := ev
		ok.Before = statusJSON("status", string(payments.StatusUnknown))
		if fourEyes {
			r, err := payments.RequestResolve(ctx, tx, payments.ApprovalRequest{OperationID: f.op, Outcome: f.outcome,
				Reason: f.raw.Reason, Evidence: f.raw.Evidence, RequestedBy: staffID(sess), RequesterName: sess.Name})
			if err != nil {
				return err
			}
			done = "requested"
			ok.After = statusJSON("status", string(payments.StatusUnknown), "outcome", string(f.outcome),
				"approval", r.State, "approval_id", int64String(r.ID))
			return audit.Record(ctx, tx, ok)
		}
		rp, err := payments.Resolve(ctx, tx, f.op, f.outcome, payments.ResolveOptions{ResolvedBy: "operator:" + staffID(sess), Topic: a.cfg.PaymentsTopic})
		if err != nil {
			return err
		}
		ok.After = statusJSON("status", string(rp.Status), "outcome", string(f.outcome))
		return audit.Record(ctx, tx, ok)
	})
	switch {
	case err == nil:
		a.metrics.actions.WithLabelValues(action, audit.OutcomeOK).Inc()
		if !fourEyes {
			a.pokeLive(ctx) // the relays and the live pages
		}
		return c.Redirect(http.StatusSeeOther, "/payments/"+f.op.String()+"?done="+done)
	case errors.Is(err, payments.ErrNotUnknown), errors.Is(err, payments.ErrApprovalPending):
		cur, gerr := payments.Get(ctx, a.pool, f.op)
		if gerr != nil {
			return gerr
		}
		a.auditAttempt(ctx, ev, "conflict", statusJSON("status", string(cur.Status)))
		msg := "Someone else acted first: the payment is " + string(cur.Status) + " now. Your resolution was not applied; nothing was changed."
		if mine := "operator:" + staffID(sess); cur.ResolvedBy == mine || strings.HasPrefix(cur.ResolvedBy, mine+" approved by ") {
			// The same form sent twice (back and submit, a second tab): the
			// first one did it, and "someone else" would send the operator
			// looking for a colleague.
			msg = "You resolved this payment already: it is " + string(cur.Status) + " now. This second submission was not applied; nothing was changed."
		}
		if errors.Is(err, payments.ErrApprovalPending) {
			msg = "A resolution of this payment already waits for approval; nothing was changed. Decide that request on the Approvals page first."
		}
		return a.renderPayment(c, http.StatusConflict, f.op, func(d *views.PaymentData) { d.Conflict = msg })
	default:
		a.auditAttempt(ctx, ev, "error", nil)
		return err
	}
}

func int64String(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// reauthFor refuses a money-moving action with a sign-in older than
// CONSOLE_RECENT_LOGIN: the refusal is audited, and the browser signs in
// again and comes back to next (the form).
func (a *App) reauthFor(c echo.Context, sess *auth.Session, route, next string) error {
	if err := a.guard.RecordDenied(c.Request().Context(), sess, requestMeta(c), route, "reauth"); err != nil {
		return err
	}
	a.metrics.actions.WithLabelValues("request", audit.OutcomeDenied).Inc()
	to := paymentReauthURL(next)
	if c.Request().Header.Get("HX-Request") != "" {
		c.Response().Header().Set("HX-Redirect", to)
		return c.NoContent(http.StatusUnauthorized)
	}
	return c.Redirect(http.StatusSeeOther, to)
}

// renderPayment renders the payment's page with status after an action
// that changed nothing, adjusted by set.
func (a *App) renderPayment(c echo.Context, status int, op uuid.UUID, set func(*views.PaymentData)) error {
	d, err := a.paymentData(c.Request().Context(), c, op)
	if err != nil {
		return err
	}
	set(&d)
	p := a.page(c, "Payment "+views.ShortID(op.String()), "/payments")
	p.URL = "/payments/" + op.String()
	return render(c, status, views.PaymentPage(p, d))
}
