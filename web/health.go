package web

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/static"
)

func (a *App) healthz(c echo.Context) error { return c.String(http.StatusOK, "ok\n") }

// readyz: the database answers and its schema is the one this binary ships.
func (a *App) readyz(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
	defer cancel()
	if err := db.Ready(ctx, a.pool); err != nil {
		a.log.Warn("readyz: not ready", "err", err)
		if errors.Is(err, db.ErrSchemaOutOfDate) {
			return c.String(http.StatusServiceUnavailable, "schema out of date\n")
		}
		return c.String(http.StatusServiceUnavailable, "database unreachable\n")
	}
	return c.String(http.StatusOK, "ready\n")
}

func staticFiles() echo.HandlerFunc {
	fs := http.StripPrefix("/static/", http.FileServerFS(static.FS))
	return func(c echo.Context) error {
		if p := c.Request().URL.Path; p == "/static/" || p[len(p)-1] == '/' {
			return echo.NewHTTPError(http.StatusNotFound) // no directory listings
		}
		c.Response().Header().Set("Cache-Control", "public, max-age=300")
		fs.ServeHTTP(c.Response(), c.Request())
		return nil
	}
}
