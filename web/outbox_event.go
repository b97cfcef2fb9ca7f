package web

import (
	"context"
	"net/http"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/pii"
	"github.com/sluice-dev/sluice/views"
)

// auditTargetOutbox is the audit trail's target type of an outbox event.
const auditTargetOutbox = "outbox_event"

// eventAuditRows is how many audit rows the detail page lists.
const eventAuditRows = 50

// eventID reads the {id} of an /outbox/{id} route; anything but a UUID is a
// 400 before any query.
func eventID(c echo.Context) (uuid.UUID, error) {
	raw := c.Param("id")
	id, err := uuid.Parse(raw)
	if err != nil || len(raw) != 36 {
		return uuid.Nil, badRequest("That is not an event id: an id is a UUID such as 0190f3a2-7c1e-7d4b-9a51-1f2e3d4c5b6a.")
	}
	return id, nil
}

// outboxEvent is GET /outbox/{id}.
func (a *App) outboxEvent(c echo.Context) error {
	id, err := eventID(c)
	if err != nil {
		return err
	}
	d, err := a.eventData(c.Request().Context(), c, id)
	if err != nil {
		return err
	}
	d.Notice = doneNotice(c.QueryParam("done"))
	return render(c, http.StatusOK, views.EventPage(a.page(c, "Event "+views.ShortID(id.String()), "/outbox"), d))
}

// eventData reads what the detail page shows: the event, its neighbours
// and holds, and the audit rows about it; the event's own state is the
// mark of its live notice.
func (a *App) eventData(ctx context.Context, c echo.Context, id uuid.UUID) (views.EventData, error) {
	e, err := outbox.Detail(ctx, a.pool, id)
	if err != nil {
		return views.EventData{}, err
	}
	entries, err := audit.ForTarget(ctx, a.pool, auditTargetOutbox, id.String(), eventAuditRows)
	if err != nil {
		return views.EventData{}, err
	}
	bulk, refs, err := a.bulkActions(ctx, a.links.Jobs && may(c, auth.PermOutboxAct), []string{id.String()}, eventAuditRows)
	if err != nil {
		return views.EventData{}, err
	}
	entries = withBulk(entries, bulk[id.String()], eventAuditRows)
	d := views.EventData{E: e, Audit: entries, Bulk: refs, CanAct: canAct(c), CanAudit: a.links.Audit && may(c, auth.PermAudit), SeeAudit: may(c, auth.PermAudit),
		MaskedPayload: pii.MaskPayload(e.EventType, e.Payload), MaskedHeaders: pii.MaskHeaders(e.Headers)}
	// The page's notice is about this event alone, whatever its status (a
	// published one may be replayed, a dead one retried): the rest of the
	// outbox moving is the list's notice, not this page's. Its mark is the
	// state this page shows, read in Detail's statement at ReadAt.
	d.Live = recordWatchURL(live.Watch{Kind: live.KindEvent, ID: e.ID}, eventMark(outbox.StateOf(e)), e.ReadAt)
	if a.links.Trace {
		d.Trace = traceURL(traceKindEvent, e.ID.String())
	}
	if a.kr != nil {
		// With the keys, sealed fields show masked ("A*** Y***") instead of
		// only "[encrypted]", and a permitted user may reveal one.
		d.MaskedPayload = a.kr.MaskSealedPayload(e.EventType, e.ID.String(), e.Payload)
		if a.mayReveal(c) {
			for _, f := range pii.SealedFields(e.EventType, e.Payload) {
				d.Reveal = append(d.Reveal, views.RevealField{TargetType: auditTargetOutbox, TargetID: e.ID.String(), Field: f})
			}
		}
	}
	return d, nil
}
