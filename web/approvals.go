package web

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/views"
)

// approvalDone are the notices after a decision.
var approvalDone = map[string]string{
	"approved": "Approved: the payment is resolved, in the same commit as the approval and its audit row.",
	"rejected": "Rejected: the payment stays unknown; its reservation is untouched.",
	"closed":   "Closed: the request's payment had been settled another way; nothing else changed.",
}

// approvalsListLimit is how many pending requests the approvals page lists.
const approvalsListLimit = 200

// approvalsPage is GET /approvals: the pending four-eyes requests. The
// live feed makes the page load its list again when they change.
func (a *App) approvalsPage(c echo.Context) error {
	rows, err := payments.PendingApprovals(c.Request().Context(), a.pool, approvalsListLimit)
	if err != nil {
		return err
	}
	sess := auth.SessionFrom(c)
	d := views.ApprovalsData{Pending: rows, Me: staffID(sess), Notice: approvalDone[c.QueryParam("done")]}
	if a.loginTooOld(sess) {
		d.ReauthURL = paymentReauthURL("/approvals")
	}
	// The list's own key, read off the rows (one snapshot), as the feed's
	// payments.PendingRead defines it: only when the list holds every
	// pending request.
	if len(rows) < approvalsListLimit {
		var newest int64
		for _, r := range rows {
			newest = max(newest, r.ID)
		}
		d.Key = views.ApprovalsKey(int64(len(rows)), newest)
	}
	return render(c, http.StatusOK, views.ApprovalsPage(a.page(c, "Approvals", "/approvals"), d))
}

// approvalsProblem answers a decision the form got wrong with the list and
// what to fix.
func (a *App) approvalsProblem(c echo.Context, status int, problem string) error {
	rows, err := payments.PendingApprovals(c.Request().Context(), a.pool, approvalsListLimit)
	if err != nil {
		return err
	}
	p := a.page(c, "Approvals", "/approvals")
	p.URL = "/approvals"
	return render(c, status, views.ApprovalsPage(p, views.ApprovalsData{Pending: rows, Me: staffID(auth.SessionFrom(c)), Problem: problem}))
}

// decideApproval is POST /approvals/{id}/approve or /reject: compare-and-set
// on the pending request, never by its requester (403, audited as denied).
// An approval needs a recent sign-in and resolves the payment in the same
// transaction as the approval and its audit row; a rejection leaves the
// payment unknown. A request decided already, or a payment no longer
// unknown, is a 409 audited as error/conflict.
func (a *App) decideApproval(approve bool) echo.HandlerFunc {
	action, done := actionReject, "rejected"
	if approve {
		action, done = actionApprove, "approved"
	}
	return func(c echo.Context) error {
		id, err := strconv.ParseInt(c.Param("id"), 10, 64)
		if err != nil || id <= 0 {
			return badRequest("That is not a request id.")
		}
		ctx := c.Request().Context()
		sess := auth.SessionFrom(c)
		if approve && a.loginTooOld(sess) {
			return a.reauthFor(c, sess, "POST /approvals/:id/approve", "/approvals")
		}
		req, err := payments.GetApproval(ctx, a.pool, id)
		if err != nil {
			return err
		}
		ev := a.actorEvent(c, sess, action, auditTargetPayment, req.OperationID.String())
		if approve {
			// An approval adopts the request's reason and evidence.
			ev.Reason, ev.Evidence = req.Reason, req.Evidence
		} else {
			// A rejection gives its own: the auditor reads why the money
			// did not move, and the requester's reason on its row read as
			// the rejecter's.
			ev.Reason = strings.TrimSpace(c.FormValue("reason"))
			problem := ""
			switch {
			case ev.Reason == "":
				problem = "Say why you reject the request: a rejection needs a reason, and it is kept in the audit trail. Nothing was changed."
			case !utf8.ValidString(ev.Reason):
				problem = "The reason is not valid text (UTF-8). Nothing was changed."
			case utf8.RuneCountInString(ev.Reason) > maxReason:
				problem = fmt.Sprintf("The reason is longer than %d characters. Nothing was changed.", maxReason)
			}
			if problem != "" {
				// Refused attempts are audited like any other (DESIGN.md).
				ev.Reason = ""
				a.auditAttempt(ctx, ev, "invalid", nil)
				return a.approvalsProblem(c, http.StatusUnprocessableEntity, problem)
			}
		}
		decided := done
		err = db.WithTx(ctx, a.pool, func(tx pgx.Tx) error {
			r, p, err := payments.Decide(ctx, tx, payments.Decision{ID: id, Approve: approve, DecidedBy: staffID(sess),
				DeciderName: sess.Name, Topic: a.cfg.PaymentsTopic})
			if err != nil {
				return err
			}
			// The payment as it is: a rejection leaves it as it was, which
			// is not unknown when it was settled another way meanwhile (a
			// settlement file, the reconcile worker); an approval moved it
			// from unknown.
			before, after := string(r.PaymentStatus), string(r.PaymentStatus)
			if approve {
				before, after = string(payments.StatusUnknown), string(p.Status)
			} else if r.PaymentStatus != payments.StatusUnknown {
				decided = "closed"
			}
			ok := ev
			ok.Before = statusJSON("status", before, "approval", payments.ApprovalPending, "approval_id", int64String(id))
			ok.After = statusJSON("status", after, "outcome", string(r.Outcome), "approval", r.State, "approval_id", int64String(id),
				"requested_by", r.RequestedBy)
			return audit.Record(ctx, tx, ok)
		})
		switch {
		case err == nil:
			a.metrics.actions.WithLabelValues(action, audit.OutcomeOK).Inc()
			if approve {
				a.pokeLive(ctx)
			}
			return c.Redirect(http.StatusSeeOther, "/approvals?done="+decided)
		case errors.Is(err, payments.ErrSelfApproval):
			if aerr := a.auditDenied(ctx, ev, "self_approval"); aerr != nil {
				return aerr
			}
			return &publicError{status: http.StatusForbidden, msg: "You made this request: a different operator must decide it. Nothing was changed."}
		case errors.Is(err, payments.ErrNotPending), errors.Is(err, payments.ErrNotUnknown):
			a.auditAttempt(ctx, ev, "conflict", nil)
			msg := "Someone else decided this request first. Nothing was changed."
			if cur, gerr := payments.GetApproval(ctx, a.pool, id); gerr == nil && cur.DecidedBy == staffID(sess) {
				msg = "You decided this request already (" + cur.State + "). This second submission was not applied; nothing was changed."
			}
			if errors.Is(err, payments.ErrNotUnknown) {
				msg = "The payment is not unknown any more (resolved by an inquiry, a settlement file or another operator). Nothing was changed; reject this request."
			}
			return &shownError{err: ErrConflict, msg: msg}
		default:
			a.auditAttempt(ctx, ev, "error", nil)
			return err
		}
	}
}
