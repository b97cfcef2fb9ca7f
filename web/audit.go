package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/views"
)

// auditForm is GET /audit's (and the export's) query, parsed: the filter,
// the page, and the raw values for the form and the links.
type auditForm struct {
	raw    views.AuditFilterForm
	filter audit.Filter
	page   audit.Page
}

// parseAuditForm reads the query; a field that cannot be read is a 400 the
// page explains.
func parseAuditForm(q url.Values) (auditForm, error) {
	f := auditForm{raw: views.AuditFilterForm{
		Actor: strings.TrimSpace(q.Get("actor")), Action: strings.TrimSpace(q.Get("action")),
		TargetType: strings.TrimSpace(q.Get("target_type")), TargetID: strings.TrimSpace(q.Get("target_id")),
		Outcome: q.Get("outcome"), From: q.Get("from"), To: q.Get("to"),
	}}
	for name, v := range map[string]string{"actor": f.raw.Actor, "action": f.raw.Action, "target type": f.raw.TargetType,
		"target id": f.raw.TargetID, "outcome": f.raw.Outcome, "from": f.raw.From, "to": f.raw.To} {
		if len(v) > maxFilterField {
			return f, fmt.Errorf("%w: %s is longer than %d characters", audit.ErrInvalidFilter, name, maxFilterField)
		}
	}
	f.filter = audit.Filter{Actor: f.raw.Actor, Action: f.raw.Action, TargetType: f.raw.TargetType,
		TargetID: f.raw.TargetID, Outcome: f.raw.Outcome}
	var err error
	if f.filter.From, err = parseFormTime("from", f.raw.From); err != nil {
		return f, fmt.Errorf("%w: %s", audit.ErrInvalidFilter, problemText(err))
	}
	if f.filter.To, err = parseFormTime("before", f.raw.To); err != nil {
		return f, fmt.Errorf("%w: %s", audit.ErrInvalidFilter, problemText(err))
	}
	f.page.After = q.Get("after")
	if len(f.page.After) > 64 {
		return f, audit.ErrInvalidCursor
	}
	return f, f.filter.Validate()
}

// auditProblem is what the page says about a filter or cursor it refused.
func auditProblem(err error) string {
	switch {
	case errors.Is(err, audit.ErrInvalidCursor):
		return "The page link is out of date or altered (its position belongs to another filter, or cannot be read). Start again from the first page."
	case errors.Is(err, audit.ErrInvalidFilter):
		msg := strings.TrimSuffix(strings.TrimPrefix(err.Error(), audit.ErrInvalidFilter.Error()+": "), ".")
		return strings.ToUpper(msg[:1]) + msg[1:] + "."
	}
	return ""
}

// auditList is GET /audit: a keyset page of the rows matching the filter,
// newest first, with the chain's status.
func (a *App) auditList(c echo.Context) error {
	ctx := c.Request().Context()
	f, err := parseAuditForm(c.QueryParams())
	chain, cerr := a.chainStatus(ctx, c)
	if cerr != nil {
		return cerr
	}
	d := views.AuditListData{Form: f.raw, Chain: chain}
	if err == nil {
		var page audit.ListPage
		if page, err = audit.List(ctx, a.pool, f.filter, f.page); err == nil {
			d.Rows = page.Rows
			if page.Next != "" {
				d.NextURL = views.AuditURL(f.raw, page.Next)
			}
			if f.page.After != "" {
				d.FirstURL = views.AuditURL(f.raw, "")
			}
			d.Total, err = listTotal(f.page.After == "", len(page.Rows), page.Next, func() (db.Total, error) {
				return audit.Count(ctx, a.pool, f.filter)
			})
			d.Counted = err == nil
		}
	}
	p := a.page(c, views.ListTitle("Audit", f.raw.Describe()), "/audit")
	if d.Problem = auditProblem(err); d.Problem != "" {
		d.Rows, d.NextURL = nil, ""
		return render(c, http.StatusBadRequest, views.AuditList(p, d))
	}
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.AuditList(p, d))
}

// chainStatus reads what the audit pages say about the chain.
func (a *App) chainStatus(ctx context.Context, c echo.Context) (views.AuditChainStatus, error) {
	s := views.AuditChainStatus{CanVerify: auth.SessionFrom(c).Can(auth.PermAudit), CSRFToken: auth.SessionFrom(c).CSRFToken()}
	st, err := audit.ReadChainStatus(ctx, a.pool)
	if err != nil {
		return s, err
	}
	s.Latest, s.LastVerified = st.Latest, st.LastVerified
	s.Notice = verifyNotice(c.QueryParam("verify"))
	return s, nil
}

// auditEntry is GET /audit/{seq}: one row whole, with links to its target's
// page (when that page exists) and to the target's audit history.
func (a *App) auditEntry(c echo.Context) error {
	raw := c.Param("seq")
	seq, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || seq <= 0 || len(raw) > 19 {
		return badRequest("That is not an audit row: a row is named by its sequence number, such as 1234.")
	}
	ctx := c.Request().Context()
	e, err := audit.Get(ctx, a.pool, seq)
	if errors.Is(err, audit.ErrNotFound) {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	if err != nil {
		return err
	}
	d := views.AuditEntryData{E: e, TargetURL: a.targetURL(e.TargetType, e.TargetID)}
	if e.TargetType != "" {
		d.HistoryURL = views.AuditHistoryURL(e.TargetType, e.TargetID)
	}
	if d.Chain, err = a.chainStatus(ctx, c); err != nil {
		return err
	}
	return render(c, http.StatusOK, views.AuditEntry(a.page(c, fmt.Sprintf("Audit row %d", seq), "/audit"), d))
}

// targetURL is the page of an audited target, "" when the console has
// none (the same route check the navigation uses: no link to a missing
// page) or the id is not one such a page takes.
func (a *App) targetURL(targetType, targetID string) string {
	switch targetType {
	case auditTargetOutbox:
		if id, err := uuid.Parse(targetID); err == nil && len(targetID) == 36 && a.links.OutboxEvent {
			return "/outbox/" + id.String()
		}
	case auditTargetPayment:
		// A payment's id is its operation id, a UUID.
		if id, err := uuid.Parse(targetID); err == nil && len(targetID) == 36 && a.links.Payment {
			return "/payments/" + id.String()
		}
	}
	return ""
}
