package web

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/views"
)

// maxFilterField bounds every text field of the list's filter.
const maxFilterField = 200

// The filter's field names are outbox.Filter's JSON names, shared by the
// list's query and the bulk form, so a list's filter opens the bulk form
// as it is.

// listForm is GET /outbox's query, parsed: the filter, the page, and the
// raw values for the form and the page's links.
type listForm struct {
	raw    views.OutboxFilterForm
	filter outbox.Filter
	page   outbox.Page
}

// timeLayouts are what a created-range field accepts (UTC): a
// datetime-local input sends the first two.
var timeLayouts = []string{"2006-01-02T15:04", "2006-01-02T15:04:05", time.RFC3339, "2006-01-02"}

// parseListForm reads the query. A field that cannot be read is a problem
// the page states (400), never a 500.
func parseListForm(q url.Values) (listForm, error) {
	f := listForm{raw: views.OutboxFilterForm{
		Status: q.Get("status"), Topic: q.Get("topic"), EventType: q.Get("event_type"),
		AggregateType: q.Get("aggregate_type"), AggregateID: q.Get("aggregate_id"), IDPrefix: strings.TrimSpace(q.Get("id_prefix")),
		ErrorText: q.Get("error_text"), From: q.Get("created_from"), To: q.Get("created_to"), Sort: q.Get("sort"),
	}}
	for name, v := range map[string]string{"topic": f.raw.Topic, "event type": f.raw.EventType, "aggregate type": f.raw.AggregateType,
		"aggregate id": f.raw.AggregateID, "id prefix": f.raw.IDPrefix, "error text": f.raw.ErrorText, "status": f.raw.Status,
		"from": f.raw.From, "to": f.raw.To, "sort": f.raw.Sort} {
		if len(v) > maxFilterField {
			return f, fmt.Errorf("%w: %s is longer than %d characters", outbox.ErrInvalidFilter, name, maxFilterField)
		}
	}
	f.filter = outbox.Filter{Status: f.raw.Status, Topic: f.raw.Topic, EventType: f.raw.EventType,
		AggregateType: f.raw.AggregateType, AggregateID: f.raw.AggregateID, IDPrefix: f.raw.IDPrefix, ErrorText: f.raw.ErrorText}
	var err error
	if f.filter.CreatedFrom, err = parseFormTime("created from", f.raw.From); err != nil {
		return f, err
	}
	if f.filter.CreatedTo, err = parseFormTime("created before", f.raw.To); err != nil {
		return f, err
	}
	switch f.raw.Sort {
	case "", "newest":
	case "oldest":
		f.page.Oldest = true
	default:
		return f, fmt.Errorf("%w: order must be newest or oldest", outbox.ErrInvalidFilter)
	}
	f.page.After = q.Get("after")
	if len(f.page.After) > 64 {
		return f, outbox.ErrInvalidCursor
	}
	return f, f.filter.Validate()
}

func parseFormTime(name, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	for _, l := range timeLayouts {
		if t, err := time.ParseInLocation(l, v, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%w: %s %q is not a time (write 2025-01-31T13:45, UTC)", outbox.ErrInvalidFilter, name, v)
}

// problemText is what the page says about a filter or cursor it refused.
func problemText(err error) string {
	switch {
	case errors.Is(err, outbox.ErrInvalidCursor):
		return "The page link is out of date or altered (its position belongs to another filter or order, or cannot be read). Start again from the first page."
	case errors.Is(err, outbox.ErrInvalidFilter):
		// outbox's filter errors are written for a form.
		msg := strings.TrimPrefix(err.Error(), outbox.ErrInvalidFilter.Error()+": ")
		return strings.ToUpper(msg[:1]) + msg[1:] + "."
	}
	return ""
}

// outboxList is GET /outbox: a keyset page of the events matching the
// filter in the URL.
func (a *App) outboxList(c echo.Context) error {
	return a.renderOutboxList(c, c.QueryParams(), http.StatusOK, nil)
}

// renderOutboxList renders the list of q's filter with status; topics, if
// not nil, adjusts the paused-topics panel (a refused pause or resume).
func (a *App) renderOutboxList(c echo.Context, q url.Values, status int, topics func(*views.TopicControlsData)) error {
	ctx := c.Request().Context()
	f, err := parseListForm(q)
	d := views.OutboxListData{Form: f.raw, Now: time.Now(), CanAct: canAct(c)}
	if err == nil {
		var mark live.Snapshot
		if mark, err = live.ReadOutbox(ctx, a.pool); err != nil {
			return err
		}
		d.Topics = views.TopicControlsData{Paused: mark.Paused, Topic: f.filter.Topic, CanAct: d.CanAct, Now: mark.At}
		if topics != nil {
			topics(&d.Topics)
		}
		d.Live = watchURL(mark, f.filter.Status != outbox.StatusDead && f.filter.Status != outbox.StatusDiscarded)
		var page outbox.ListPage
		if page, err = outbox.List(ctx, a.pool, f.filter, f.page); err == nil {
			d.Rows = page.Rows
			if page.Next != "" {
				d.NextURL = listURL(f.raw, page.Next)
			}
			if f.page.After != "" {
				d.FirstURL = listURL(f.raw, "")
			}
			d.Total, err = listTotal(f.page.After == "", len(page.Rows), page.Next, func() (db.Total, error) {
				return outbox.Count(ctx, a.pool, f.filter)
			})
			d.Counted = err == nil
		}
	}
	if d.Problem = problemText(err); d.Problem != "" {
		d.Rows, d.NextURL = nil, ""
		return render(c, http.StatusBadRequest, views.OutboxList(a.page(c, views.ListTitle("Outbox", f.raw.Describe()), "/outbox"), d))
	}
	if err != nil {
		return err
	}
	return render(c, status, views.OutboxList(a.page(c, views.ListTitle("Outbox", f.raw.Describe()), "/outbox"), d))
}

// listURL is the list page of raw's filter, continuing after the cursor.
func listURL(raw views.OutboxFilterForm, after string) string {
	v := raw.Values()
	if after != "" {
		v.Set("after", after)
	}
	if len(v) == 0 {
		return "/outbox"
	}
	return "/outbox?" + v.Encode()
}

// listTotal is a list page's header count. A first page without a next
// one holds the whole list, so its rows are the count: no count statement
// runs, and the header agrees with the page. A filter that matches nothing
// or little is the one a count cannot stop early on (it reads every row its
// plan offers, the whole table when no index serves the filter), and its
// first page is all there is. Any other page calls count.
func listTotal(firstPage bool, rows int, next string, count func() (db.Total, error)) (db.Total, error) {
	if firstPage && next == "" {
		return db.Total{N: int64(rows)}, nil
	}
	return count()
}

// canAct reports whether the user may act on outbox events: the buttons
// appear only then (the route's guard checks again).
func canAct(c echo.Context) bool { return may(c, auth.PermOutboxAct) }

// may reports whether the signed-in user has permission p (pages render
// only the buttons a user may press; the server checks again).
func may(c echo.Context, p auth.Permission) bool {
	s := auth.SessionFrom(c)
	return s != nil && s.Can(p)
}
