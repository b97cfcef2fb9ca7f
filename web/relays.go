package web

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/views"
)

// relaysPage is GET /relays: every relay's report (outbox_relay), those that
// need a look first. The dashboard's Relays tile counts the same rows.
func (a *App) relaysPage(c echo.Context) error {
	relays, at, err := outbox.ListRelays(c.Request().Context(), a.pool)
	if err != nil {
		return err
	}
	d := views.RelaysData{At: at, Relays: relays, ReportEvery: outbox.DefaultReportInterval,
		SilentAfter: outbox.RelaySilentAfter * outbox.DefaultReportInterval}
	return render(c, http.StatusOK, views.Relays(a.page(c, "Relays", "/relays"), d))
}
