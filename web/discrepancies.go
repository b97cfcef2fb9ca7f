package web

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/views"
)

// actionCloseDiscrepancy is the audit action of an operator's close of a
// discrepancy (target: the payment).
const actionCloseDiscrepancy = "payments.close_discrepancy"

// discrepancyListForm is GET /payments/discrepancies's query, parsed.
type discrepancyListForm struct {
	closed bool
	after  string
}

func parseDiscrepancyListForm(q url.Values) (discrepancyListForm, string) {
	var f discrepancyListForm
	switch q.Get("state") {
	case "", "open":
	case "closed":
		f.closed = true
	default:
		return f, "The list is either open or closed discrepancies (state=open or state=closed)."
	}
	f.after = q.Get("after")
	if len(f.after) > 64 {
		return f, "The page link is out of date or altered. Start again from the first page."
	}
	return f, ""
}

func discrepancyListURL(closed bool, after string) string {
	v := url.Values{}
	if closed {
		v.Set("state", "closed")
	}
	if after != "" {
		v.Set("after", after)
	}
	if len(v) == 0 {
		return views.DiscrepanciesPath
	}
	return views.DiscrepanciesPath + "?" + v.Encode()
}

// discrepancyList is GET /payments/discrepancies: the open discrepancies,
// oldest first, or the closed ones (state=closed), newest close first;
// keyset pages either way (payments.ListDiscrepancies).
func (a *App) discrepancyList(c echo.Context) error {
	ctx := c.Request().Context()
	f, problem := parseDiscrepancyListForm(c.QueryParams())
	d := views.DiscrepancyListData{Closed: f.closed, CanAct: may(c, auth.PermPaymentsAct), PaymentOK: a.links.Payment}
	if may(c, auth.PermAudit) && a.links.Audit {
		d.NotFound = "/audit?" + url.Values{"action": {payments.ActionSettleNotFound}}.Encode()
	}
	page := a.page(c, "Discrepancies", "/payments")
	if problem == "" {
		list, err := payments.ListDiscrepancies(ctx, a.pool, payments.DiscrepancyPage{Closed: f.closed, After: f.after})
		switch {
		case errors.Is(err, payments.ErrInvalidCursor):
			problem = "The page link is out of date or altered (its position belongs to the other list, or cannot be read). Start again from the first page."
		case err != nil:
			return err
		default:
			d.Rows, d.ReadAt = list.Rows, list.ReadAt
			if list.Next != "" {
				d.NextURL = discrepancyListURL(f.closed, list.Next)
			}
			if f.after != "" {
				d.FirstURL = discrepancyListURL(f.closed, "")
			}
		}
	}
	if problem != "" {
		d.Problem = problem
		return render(c, http.StatusBadRequest, views.DiscrepancyList(page, d))
	}
	n, err := payments.CountOpenDiscrepancies(ctx, a.pool)
	if err != nil {
		return err
	}
	d.Open, d.Counted = n, true
	return render(c, http.StatusOK, views.DiscrepancyList(page, d))
}

// closeDiscrepancyForm is POST /payments/discrepancies/{id}/close, parsed
// (STYLE.md 17).
type closeDiscrepancyForm struct {
	id       int64
	raw      views.DiscrepancyCloseForm
	problems map[string]string
	// notSeenOpen: the form did not carry expected=open (not our page's
	// form): refused as a 400, and audited.
	notSeenOpen bool
}

func parseCloseDiscrepancyForm(c echo.Context) (closeDiscrepancyForm, error) {
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil || id <= 0 {
		return closeDiscrepancyForm{}, badRequest("That is not a discrepancy id.")
	}
	f := closeDiscrepancyForm{id: id, problems: map[string]string{},
		raw: views.DiscrepancyCloseForm{ID: id, Reason: strings.TrimSpace(c.FormValue("reason"))}}
	f.notSeenOpen = c.FormValue("expected") != "open"
	checkText(f.problems, "close_reason", f.raw.Reason,
		"Say what was done outside the console (a refund issued, the provider corrected its file): it is required and kept in the audit trail.")
	return f, nil
}

// closeDiscrepancy is POST /payments/discrepancies/{id}/close: in one READ
// COMMITTED transaction payments.CloseDiscrepancy (compare-and-set from
// open) and the audit row (target the payment, the reason as typed). It
// records who closed it and why and changes nothing else: never the
// payment's status, its reservation or the ledger, whose correction
// happens outside the system. It needs a recent sign-in, as a resolve
// does: the console's word that the money was put right is worth what the
// sign-in behind it is. A discrepancy closed meanwhile is a 409 that says
// by whom (you, from another tab or a second submit, or another operator),
// audited as error/conflict.
func (a *App) closeDiscrepancy(c echo.Context) error {
	f, err := parseCloseDiscrepancyForm(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	sess := auth.SessionFrom(c)
	cur, err := payments.GetDiscrepancy(ctx, a.pool, f.id)
	if err != nil {
		return err
	}
	op := cur.OperationID
	if a.loginTooOld(sess) {
		return a.reauthFor(c, sess, "POST /payments/discrepancies/:id/close", "/payments/"+op.String())
	}
	ev := a.actorEvent(c, sess, actionCloseDiscrepancy, auditTargetPayment, op.String())
	ev.Reason = f.raw.Reason
	if f.notSeenOpen {
		a.auditAttempt(ctx, ev, "bad_request", nil)
		return badRequest("The form did not say that the discrepancy was open when you saw it; reload the payment and try again.")
	}
	if len(f.problems) > 0 {
		a.auditAttempt(ctx, ev, "invalid", nil)
		return a.renderPayment(c, http.StatusUnprocessableEntity, op, func(d *views.PaymentData) {
			d.CloseForm, d.FieldErrors = f.raw, f.problems
		})
	}
	var closed payments.Discrepancy
	err = db.WithTx(ctx, a.pool, func(tx pgx.Tx) error {
		var err error
		closed, err = payments.CloseDiscrepancy(ctx, tx, payments.DiscrepancyClose{ID: f.id, OperationID: op,
			ClosedBy: staffID(sess), CloserName: sess.Name, Reason: f.raw.Reason})
		if err != nil {
			return err
		}
		ok := ev
		ok.Before = discrepancyJSON(cur, "open")
		ok.After = discrepancyJSON(closed, "closed")
		return audit.Record(ctx, tx, ok)
	})
	switch {
	case err == nil:
		a.metrics.actions.WithLabelValues(actionCloseDiscrepancy, audit.OutcomeOK).Inc()
		a.feed.Poke() // the dashboard's count
		return c.Redirect(http.StatusSeeOther, "/payments/"+op.String()+"?done=discrepancy_closed#discrepancies")
	case errors.Is(err, payments.ErrDiscrepancyClosed):
		a.auditAttempt(ctx, ev, "conflict", discrepancyJSON(closed, "closed", "closed_by", closed.ResolvedBy))
		return a.renderPayment(c, http.StatusConflict, op, func(d *views.PaymentData) {
			d.Conflict = closedConflict(closed, staffID(sess))
		})
	default:
		a.auditAttempt(ctx, ev, "error", nil)
		return err
	}
}

// discrepancyJSON is a discrepancy for an audit row's before or after:
// ids, statuses and outcome words (state: open or closed; the payment's
// status is the same in both, closing never changes it), never customer
// data or free text.
func discrepancyJSON(d payments.Discrepancy, state string, extra ...string) json.RawMessage {
	kv := []string{"discrepancy", state, "discrepancy_id", strconv.FormatInt(d.ID, 10), "status", string(d.RecordedStatus),
		"provider_says", string(d.ProviderOutcome), "source", d.Source}
	return statusJSON(append(kv, extra...)...)
}

// closedConflict says who closed a discrepancy first: "you" when it was
// the same person (a second submit, another tab), not "someone else".
func closedConflict(d payments.Discrepancy, me string) string {
	when := ""
	if d.ResolvedAt != nil {
		when = " at " + views.UTCText(*d.ResolvedAt)
	}
	who := "Another operator, " + nameOr(d.ResolverName, d.ResolvedBy) + ","
	if d.ResolvedBy == me {
		who = "You"
	}
	return who + " closed this discrepancy already" + when + " (“" + d.Resolution + "”). Your close was not applied; nothing was changed."
}

func nameOr(name, id string) string {
	if name != "" {
		return name
	}
	return id
}
