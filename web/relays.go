package web

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/views"
)

// relaysPage is GET /relays: every relay's report (outbox_relay), those that
// need a look first, and a warning when the running relays publish
// differently, as the dashboard's Relays tile counts them (outbox.Relays).
func (a *App) relaysPage(c echo.Context) error {
	ctx := c.Request().Context()
	relays, at, err := outbox.ListRelays(ctx, a.pool)
	if err != nil {
		return err
	}
	counted, err := outbox.ReadRelays(ctx, a.pool)
	if err != nil {
		return err
	}
	d := views.RelaysData{At: at, Relays: relays, ReportEvery: outbox.DefaultReportInterval,
		SilentAfter: outbox.RelaySilentAfter * outbox.DefaultReportInterval, Disagree: views.RelaysDisagreement(counted)}
	return render(c, http.StatusOK, views.Relays(a.page(c, "Relays", "/relays"), d))
}
