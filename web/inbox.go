package web

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/views"
)

// inboxPage is GET /inbox: per consumer, what the live snapshot counts
// (inbox.ConsumersRead), with sparklines over the snapshot history, and the
// last pruning pass with the retention it used (the console is not told
// INBOX_RETENTION; before any pass the page states the default and says so),
// and the consumer processes' reports with what they leave unread, as of the
// same snapshot as the dashboard's tile and /metrics.
func (a *App) inboxPage(c echo.Context) error {
	s, ok := a.feed.Latest()
	d := inboxData(s, ok, a.feed.History())
	run, pruned, err := inbox.LastPrune(c.Request().Context(), a.pool)
	if err != nil {
		return err
	}
	if pruned {
		d.Retention, d.RetentionDefault = views.Age(run.Retention), false
		d.LastPruned, d.PrunedRows = run.At, run.Deleted
	}
	return render(c, http.StatusOK, views.Inbox(a.page(c, "Inbox", "/inbox"), d))
}

func inboxData(s live.Snapshot, ok bool, hist []live.Snapshot) views.InboxData {
	d := views.InboxData{Ready: ok, At: s.At, Total: inbox.Total(s.Consumers), Span: spanOf(hist),
		Retention: views.Age(inbox.DefaultRetention), RetentionDefault: true,
		Processes: s.Processes, Problems: views.ConsumerProblems(s.At, s.ConsumerProblems()),
		ReportEvery: inbox.DefaultReportInterval, SilentAfter: inbox.ProcessSilentAfter * inbox.DefaultReportInterval}
	for _, cs := range s.Consumers {
		processed, duplicates := consumerRates(cs.Consumer, hist)
		d.Consumers = append(d.Consumers, views.InboxConsumer{ConsumerStats: cs,
			Processed:  views.NewSpark("Processed/s of "+cs.Consumer, "spark-processed", "rate", processed, views.Rate),
			Duplicates: views.NewSpark("Duplicates/s of "+cs.Consumer, "spark-duplicates", "age", duplicates, views.Rate),
		})
	}
	return d
}

// consumerRates are a consumer's processed and duplicate rates between
// consecutive snapshots (its counts are totals since it started).
func consumerRates(name string, hist []live.Snapshot) (processed, duplicates []float64) {
	var (
		prev    inbox.ConsumerStats
		prevAt  = -1
		present = func(h live.Snapshot) (inbox.ConsumerStats, bool) {
			for _, c := range h.Consumers {
				if c.Consumer == name {
					return c, true
				}
			}
			return inbox.ConsumerStats{}, false
		}
	)
	for i, h := range hist {
		cur, ok := present(h)
		if !ok {
			continue
		}
		if prevAt >= 0 {
			dt := h.At.Sub(hist[prevAt].At).Seconds()
			if dt > 0 {
				processed = append(processed, max(float64(cur.Processed-prev.Processed), 0)/dt)
				duplicates = append(duplicates, max(float64(cur.Duplicates-prev.Duplicates), 0)/dt)
			}
		}
		prev, prevAt = cur, i
	}
	return processed, duplicates
}
