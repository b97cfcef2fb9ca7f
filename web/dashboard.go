package web

import (
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/views"
)

// page builds the layout data for the signed-in user: the navigation shows
// only what the roles may see (the server checks again on every route).
func (a *App) page(c echo.Context, title, active string) views.Page {
	sess := auth.SessionFrom(c)
	p := views.Page{Title: title, Active: active}
	if sess == nil {
		return p
	}
	p.User, p.Role, p.CSRFToken = sess.Name, strings.Join(sess.RoleNames(), ", "), sess.CSRFToken()
	if p.User == "" {
		p.User = sess.Subject
	}
	// A link appears with the page that backs it (STYLE.md 18): every
	// entry but the dashboard waits for its route to exist.
	if sess.Can(auth.PermView) {
		p.Nav = append(p.Nav, views.NavItem{Href: "/", Label: "Dashboard", Key: "d", TestID: "nav-dashboard"})
		for _, n := range []struct {
			on   bool
			item views.NavItem
		}{
			{a.links.Outbox, views.NavItem{Href: "/outbox", Label: "Outbox", Key: "o", TestID: "nav-outbox"}},
			{a.links.Payments, views.NavItem{Href: "/payments", Label: "Payments", Key: "p", TestID: "nav-payments"}},
			{a.links.Inbox, views.NavItem{Href: "/inbox", Label: "Inbox", Key: "i", TestID: "nav-inbox"}},
			{a.links.Relays, views.NavItem{Href: "/relays", Label: "Relays", Key: "l", TestID: "nav-relays"}},
		} {
			if n.on {
				p.Nav = append(p.Nav, n.item)
			}
		}
	}
	if sess.Can(auth.PermPaymentsAct) && a.links.Approvals {
		p.Nav = append(p.Nav, views.NavItem{Href: "/approvals", Label: "Approvals", Key: "r", TestID: "nav-approvals"})
	}
	if sess.Can(auth.PermOutboxAct) && a.links.Jobs {
		p.Nav = append(p.Nav, views.NavItem{Href: "/jobs", Label: "Jobs", Key: "j", TestID: "nav-jobs"})
	}
	if sess.Can(auth.PermAudit) && a.links.Audit {
		p.Nav = append(p.Nav, views.NavItem{Href: "/audit", Label: "Audit", Key: "a", TestID: "nav-audit"})
	}
	return p
}

func (a *App) dashboard(c echo.Context) error {
	s, ok := a.feed.Latest()
	d := dashboardData(s, ok, a.feed.History(), a.thresholds())
	d.Links = a.links
	// As the navigation's Approvals link (page): the route's permission.
	sess := auth.SessionFrom(c)
	d.MayApprove = sess != nil && sess.Can(auth.PermPaymentsAct)
	return render(c, http.StatusOK, views.Dashboard(a.page(c, "Dashboard", "/"), d))
}

func dashboardData(s live.Snapshot, ok bool, hist []live.Snapshot, warn views.Thresholds) views.DashboardData {
	backlog := make([]float64, len(hist))
	rate := make([]float64, len(hist))
	age := make([]float64, len(hist))
	for i, h := range hist {
		backlog[i], rate[i], age[i] = float64(h.Pending), h.PublishedPerSec, h.ReconcileAge.Seconds()
	}
	sparks := []views.Spark{
		views.NewSpark("Backlog", "spark-backlog", "backlog", backlog, func(v float64) string { return views.Count(int64(v)) }),
		views.NewSpark("Published/s", "spark-rate", "rate", rate, views.Rate),
		views.NewSparkWarn("Reconcile age", "spark-reconcile", "age", age, func(v float64) string { return views.Age(secondsDur(v)) },
			warn.ReconcileAge.Seconds()),
	}
	for i := range sparks {
		sparks[i].Span, sparks[i].From = spanOf(hist), fromOf(hist)
	}
	return views.DashboardData{Snap: s, Ready: ok, Sparks: sparks, Warn: warn}
}

// spanOf says how much history the sparklines draw: the ring holds an hour,
// but a console that started a few minutes ago has only those minutes.
func spanOf(hist []live.Snapshot) string {
	if len(hist) < 2 {
		return "since start"
	}
	d := hist[len(hist)-1].At.Sub(hist[0].At)
	if d >= 59*time.Minute {
		return "last hour"
	}
	return "last " + views.Age(d.Round(time.Second))
}

// fromOf labels the left end of the sparklines' time axis.
func fromOf(hist []live.Snapshot) string {
	if len(hist) < 2 {
		return "start"
	}
	return views.Age(hist[len(hist)-1].At.Sub(hist[0].At).Round(time.Second)) + " ago"
}

// thresholds are the dashboard's warning levels (CONSOLE_WARN_*).
func (a *App) thresholds() views.Thresholds {
	return views.Thresholds{OldestPending: a.cfg.WarnOldestPending, ReconcileAge: a.cfg.WarnReconcileAge, Dead: a.cfg.WarnDead}
}
