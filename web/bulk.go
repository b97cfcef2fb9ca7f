package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/views"
)

// bulkSample is how many matching ids a dry run lists.
const bulkSample = 20

// bulkForm is POST /outbox/bulk (and the query of GET /outbox/bulk): the
// outbox list's filter under outbox.Filter's JSON names, the action, its
// reason, and either dry_run=1 or the count the operator confirmed.
type bulkForm struct {
	Values views.BulkValues
	Filter outbox.Filter
	DryRun bool
	Expect int64 // the count the confirmation named; -1 when absent
	Errors map[string]string
}

// parseBulkForm reads and validates a bulk request from get (a form or a
// query). Field errors are in Errors; the filter's own rules (which status
// an action applies to, bounded error search) are checked by the domain.
func parseBulkForm(get func(string) string) bulkForm {
	f := bulkForm{Expect: -1, Errors: map[string]string{}}
	v := &f.Values
	for _, fld := range []struct {
		name string
		dst  *string
	}{{"status", &v.Status}, {"topic", &v.Topic}, {"event_type", &v.EventType}, {"aggregate_type", &v.AggregateType},
		{"aggregate_id", &v.AggregateID}, {"id_prefix", &v.IDPrefix}, {"error_text", &v.ErrorText},
		{"created_from", &v.CreatedFrom}, {"created_to", &v.CreatedTo}, {"action", &v.Action}, {"consumer", &v.Consumer}} {
		s := strings.TrimSpace(get(fld.name))
		if len(s) > maxFilterField || !utf8.ValidString(s) {
			f.Errors[fld.name] = fmt.Sprintf("at most %d characters of text", maxFilterField)
			s = ""
		}
		*fld.dst = s
	}
	v.Reason = strings.TrimSpace(get("reason"))
	if len(v.Reason) > maxReason || !utf8.ValidString(v.Reason) {
		f.Errors["reason"] = fmt.Sprintf("at most %d characters of text", maxReason)
		v.Reason = ""
	}
	if v.AggregateID != "" && v.AggregateType == "" && f.Errors["aggregate_id"] == "" {
		// outbox.Filter refuses it too; said here, it shows at the field
		// and not only above the form.
		f.Errors["aggregate_id"] = "an aggregate id needs its aggregate type: fill in Aggregate type too"
	}
	f.Filter = outbox.Filter{Status: v.Status, Topic: v.Topic, EventType: v.EventType, AggregateType: v.AggregateType,
		AggregateID: v.AggregateID, IDPrefix: v.IDPrefix, ErrorText: v.ErrorText}
	for _, c := range []struct {
		name, val string
		dst       *time.Time
	}{{"created_from", v.CreatedFrom, &f.Filter.CreatedFrom}, {"created_to", v.CreatedTo, &f.Filter.CreatedTo}} {
		if c.val == "" {
			continue
		}
		t, err := parseFormTime(c.name, c.val)
		if err != nil {
			f.Errors[c.name] = "a time such as 2025-01-31T14:00 (UTC) or RFC 3339"
			continue
		}
		*c.dst = t
	}
	switch v.Action {
	case outbox.JobRetry, outbox.JobDeadLetter, outbox.JobDiscard, outbox.JobReplay:
		if v.Action != outbox.JobRetry && v.Reason == "" {
			f.Errors["reason"] = "a reason is required to " + strings.ToLower(views.ActionWords(v.Action))
		}
	default:
		f.Errors["action"] = "choose retry, dead-letter, discard or replay"
	}
	switch {
	case v.Consumer == "":
	case v.Action != outbox.JobReplay:
		f.Errors["consumer"] = "only a replay goes to one consumer"
	case broker.ValidateConsumer(v.Consumer) != nil:
		f.Errors["consumer"] = "a consumer name is 1–64 of A-Z, a-z, 0-9, _ and -"
	}
	f.DryRun = get("dry_run") == "1"
	if e := get("expect"); e != "" {
		n, err := strconv.ParseInt(e, 10, 64)
		if err != nil || n < 0 {
			f.Errors["expect"] = "not a count"
		} else {
			f.Expect = n
		}
	}
	if !f.DryRun && f.Expect < 0 && f.Errors["expect"] == "" {
		f.Errors["expect"] = "run a dry run first, then confirm its count"
	}
	if !f.DryRun && f.Errors["expect"] == "" {
		// The dry run's time: the job acts on what matched then, once.
		seen, err := time.Parse(time.RFC3339Nano, get("seen_at"))
		if err != nil {
			f.Errors["expect"] = "run a dry run first, then confirm it (the confirmation names when the dry run ran)"
		} else {
			f.Filter.StateBy = &seen
		}
	}
	return f
}

// problem is the form's errors as one sentence for the top of the form.
func (f bulkForm) problem() string {
	if e := f.Errors["expect"]; e != "" {
		return "Confirm a bulk action from its dry run: " + e + "."
	}
	if len(f.Errors) > 0 {
		return "Some fields are not valid."
	}
	return ""
}

// bulkForm shows the bulk form, filled from the query (the outbox list's
// filter, or the form a re-authentication returns to).
func (a *App) bulkForm(c echo.Context) error {
	f := parseBulkForm(c.QueryParam)
	d := views.BulkFormData{Values: f.Values}
	if d.Values.Action == "" {
		d.Values.Action = outbox.JobRetry
	}
	return render(c, http.StatusOK, views.BulkForm(a.page(c, "Bulk action", "/jobs"), d))
}

// bulk is the dry run (dry_run=1: the exact count and a sample, nothing
// changes) or the confirmation (a job and the audit row that opens it, in
// one transaction, then 303 to the job's page).
func (a *App) bulk(c echo.Context) error {
	f := parseBulkForm(c.FormValue)
	if len(f.Errors) > 0 {
		return a.bulkInvalid(c, f, "")
	}
	if f.DryRun {
		return a.bulkPreview(c, f, http.StatusOK, "")
	}
	return a.bulkConfirm(c, f)
}

// bulkInvalid shows the form again with what is wrong (422).
func (a *App) bulkInvalid(c echo.Context, f bulkForm, problem string) error {
	if problem == "" {
		problem = f.problem()
	}
	d := views.BulkFormData{Values: f.Values, Errors: f.Errors, Problem: sentence(problem)}
	return render(c, http.StatusUnprocessableEntity, views.BulkForm(a.page(c, "Bulk action", "/jobs"), d))
}

// sentence is a message as a sentence of its own: a capital first letter
// and a full stop (the domain's messages are clauses: "an aggregate id
// needs its aggregate type").
func sentence(msg string) string {
	if msg == "" {
		return ""
	}
	r, size := utf8.DecodeRuneInString(msg)
	msg = string(unicode.ToUpper(r)) + msg[size:]
	if !strings.HasSuffix(msg, ".") {
		msg += "."
	}
	return msg
}

// domainProblem is an invalid filter or action as a form message.
func domainProblem(err error) (string, bool) {
	for _, sentinel := range []error{outbox.ErrInvalidFilter, outbox.ErrInvalidAction} {
		if errors.Is(err, sentinel) {
			return strings.TrimPrefix(err.Error(), sentinel.Error()+": "), true
		}
	}
	return "", false
}

func (a *App) bulkPreview(c echo.Context, f bulkForm, status int, notice string) error {
	p, err := outbox.Preview(c.Request().Context(), a.pool, f.Values.Action, f.Filter, bulkSample)
	if msg, ok := domainProblem(err); ok {
		return a.bulkInvalid(c, f, msg)
	}
	if err != nil {
		return err
	}
	d := views.BulkPreviewData{Values: f.Values, Filter: f.Filter, Count: p.Count, Sample: p.Sample, At: p.At, Links: a.links,
		Threshold: a.cfg.BulkRecentLoginAbove, Notice: notice}
	if f.Values.Action == outbox.JobReplay {
		if err := a.replayRetention(c.Request().Context(), f.Filter, &d); err != nil {
			return err
		}
	}
	if a.needsRecentLogin(auth.SessionFrom(c), p.Count) {
		d.ReauthURL = a.reauthURL(f)
	}
	return render(c, status, views.BulkPreview(a.page(c, "Dry run", "/jobs"), d))
}

// needsRecentLogin: a bulk action over the threshold moves a lot at once,
// so it needs a sign-in no older than RecentLogin. A count that stopped at
// its cap counts as over the threshold, whatever the threshold: past the
// cap, how many is not known.
func (a *App) needsRecentLogin(sess *auth.Session, count db.Total) bool {
	over := count.MoreThan > 0 || count.N > int64(a.cfg.BulkRecentLoginAbove)
	return over && a.now().Sub(sess.AuthTime) > a.cfg.RecentLogin
}

// reauthURL signs in again at the provider (prompt=login, max_age=0) and
// comes back to the bulk form with the same filter and action.
func (a *App) reauthURL(f bulkForm) string {
	next := "/outbox/bulk?" + views.BulkQuery(f.Values).Encode()
	return "/login?reauth=1&next=" + url.QueryEscape(next)
}

// errStaleLogin and errMoreThanConfirmed roll a confirmation back.
var (
	errStaleLogin        = errors.New("web: bulk action needs a recent login")
	errMoreThanConfirmed = errors.New("web: the filter matches more events than confirmed")
)

func (a *App) bulkConfirm(c echo.Context, f bulkForm) error {
	ctx := c.Request().Context()
	sess := auth.SessionFrom(c)
	requestedBy := sess.Name
	if requestedBy == "" {
		requestedBy = sess.Subject
	}
	var job outbox.Job
	err := db.WithTx(ctx, a.pool, func(tx pgx.Tx) error {
		j, err := outbox.CreateJob(ctx, tx, outbox.JobRequest{
			Kind: f.Values.Action, Filter: f.Filter, Reason: f.Values.Reason, RequestedBy: requestedBy, ReplayTo: f.Values.Consumer,
		})
		if errors.Is(err, outbox.ErrConfirmedAlready) {
			job = j
		}
		if err != nil {
			return err
		}
		// The job covers what matches now; never more than the operator
		// confirmed, and over the threshold only with a recent sign-in.
		// Both counts stop at the same cap: a dry run's "more than"
		// confirms any number past it (outbox.CreateJob).
		if j.MatchedTotal().Counted() > f.Expect {
			job = j
			return errMoreThanConfirmed
		}
		if a.needsRecentLogin(sess, j.MatchedTotal()) {
			return errStaleLogin
		}
		filter, err := json.Marshal(f.Filter)
		if err != nil {
			return err
		}
		ev := a.actorEvent(c, sess, actionBulkCreate, jobTarget, j.ID.String())
		ev.Reason = j.Reason
		after := withMatched(j, map[string]any{"kind": j.Kind, "filter": json.RawMessage(filter), "chunk_size": j.ChunkSize})
		if j.ReplayTo != "" {
			after["replay_to"] = j.ReplayTo
		}
		ev.After, err = json.Marshal(after)
		if err != nil {
			return err
		}
		if err := audit.Record(ctx, tx, ev); err != nil {
			return err
		}
		if j.Finished() { // nothing matched: the job ends as it opens
			if err := auditJobEnd(ctx, tx, j); err != nil {
				return err
			}
		}
		job = j
		return nil
	})
	switch {
	case errors.Is(err, outbox.ErrConfirmedAlready):
		// Audited like any refused attempt: nothing was made, and the
		// row names the job the confirmation had made.
		if err := a.auditFailed(c, sess, actionBulkCreate, job.ID.String(), "confirmed_already"); err != nil {
			return err
		}
		a.metrics.actions.WithLabelValues(actionBulkCreate, "conflict").Inc()
		return c.Redirect(http.StatusSeeOther, "/jobs/"+job.ID.String()+"?done=already")
	case errors.Is(err, errMoreThanConfirmed):
		if err := a.auditFailed(c, sess, actionBulkCreate, "", "count_changed"); err != nil {
			return err
		}
		a.metrics.actions.WithLabelValues(actionBulkCreate, "conflict").Inc()
		return a.bulkPreview(c, f, http.StatusConflict, fmt.Sprintf(
			"The filter now matches %s events, more than the %s you confirmed. Nothing was changed; check the new count and confirm again.",
			views.TotalText(job.MatchedTotal()), views.Count(f.Expect)))
	case errors.Is(err, errStaleLogin):
		if err := a.guard.RecordDenied(ctx, sess, requestMeta(c), "POST /outbox/bulk", "reauth"); err != nil {
			return err
		}
		a.metrics.actions.WithLabelValues(actionBulkCreate, audit.OutcomeDenied).Inc()
		return c.Redirect(http.StatusSeeOther, a.reauthURL(f))
	}
	if msg, ok := domainProblem(err); ok {
		return a.bulkInvalid(c, f, msg)
	}
	if err != nil {
		return jobError(err)
	}
	a.metrics.actions.WithLabelValues(actionBulkCreate, audit.OutcomeOK).Inc()
	a.feed.Poke()
	return c.Redirect(http.StatusSeeOther, "/jobs/"+job.ID.String())
}

// replay is POST /outbox/replay: the bulk flow (dry run, then a durable
// job confirmed with the dry run's count) for the replay action only.
func (a *App) replay(c echo.Context) error {
	f := parseBulkForm(func(name string) string {
		if name == "action" {
			return outbox.JobReplay
		}
		return c.FormValue(name)
	})
	if len(f.Errors) > 0 {
		return a.bulkInvalid(c, f, "")
	}
	if f.DryRun {
		return a.bulkPreview(c, f, http.StatusOK, "")
	}
	return a.bulkConfirm(c, f)
}

// replayRetention fills in how many of a replay's events were last
// published before the inbox's retention: the retention of the inbox's last
// pruning pass when there was one, else the default.
func (a *App) replayRetention(ctx context.Context, f outbox.Filter, d *views.BulkPreviewData) error {
	d.Retention = inbox.DefaultRetention
	run, ok, err := inbox.LastPrune(ctx, a.pool)
	if err != nil {
		return err
	}
	if ok && run.Retention > 0 {
		d.Retention, d.RetentionMeasured = run.Retention, true
	}
	d.OlderThanRetention, err = outbox.CountPublishedBefore(ctx, a.pool, f, a.now().Add(-d.Retention))
	return err
}
