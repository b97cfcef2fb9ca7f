package web

import (
	"bytes"
	"context"
	"time"

	"github.com/a-h/templ"

	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/views"
)

func secondsDur(v float64) time.Duration { return time.Duration(v * float64(time.Second)) }

// renderLive renders the dashboard's fragments for a websocket push with
// the same components as the page, as out-of-band swaps. The feed calls it
// once per tick, whatever the number of browsers; the fragments carry no
// PII (ids, counts, amounts and ages only).
func (a *App) renderLive(s live.Snapshot, hist []live.Snapshot) ([]live.Fragment, error) {
	d := dashboardData(s, true, hist, a.thresholds())
	d.Links = a.links
	parts := []struct {
		id   string
		comp templ.Component
	}{
		{"updated", views.Updated(d, true)},
		{"tiles", views.Tiles(d, true)},
		{"sparks", views.Sparklines(d, true)},
		{"topics", views.Topics(d, true)},
		{"recent-dead", views.RecentDead(d, true)},
		{"recent-unknown", views.RecentUnknown(d, true)},
	}
	out := make([]live.Fragment, 0, len(parts))
	for _, p := range parts {
		var buf bytes.Buffer
		if err := p.comp.Render(context.Background(), &buf); err != nil {
			return nil, err
		}
		out = append(out, live.Fragment{ID: p.id, HTML: buf.Bytes()})
	}
	// The jobs pages: each job's state and progress bar, swapped by id.
	for _, j := range s.Jobs {
		var buf bytes.Buffer
		if err := views.JobLive(j, true).Render(context.Background(), &buf); err != nil {
			return nil, err
		}
		out = append(out, live.Fragment{Page: live.PageJobs, ID: views.JobLiveID(j.ID), HTML: buf.Bytes()})
	}
	// The approvals page: a signal that makes it reload its list (the list
	// has per-user buttons and forms, so it is not pushed itself). The
	// fragment changes, and so is sent, only when a request is made or
	// decided.
	var signal bytes.Buffer
	if err := views.ApprovalsSignal(s.Approvals.Pending, s.Approvals.Newest).Render(context.Background(), &signal); err != nil {
		return nil, err
	}
	out = append(out, live.Fragment{Page: live.PageApprovals, ID: views.ApprovalsSignalID, HTML: signal.Bytes()})
	// The audit pages: the chain's verification state (no per-user part).
	var buf bytes.Buffer
	chain := views.AuditChainStatus{Latest: s.Chain.Latest, LastVerified: s.Chain.LastVerified}
	if err := views.AuditChainState(chain, true).Render(context.Background(), &buf); err != nil {
		return nil, err
	}
	out = append(out, live.Fragment{Page: live.PageAudit, ID: views.AuditChainStateID, HTML: buf.Bytes()})
	return out, nil
}
