package web

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/views"
)

// Audit actions of a bulk job: one row opens it (bulk.go), one per chunk,
// one closes it; a cancel request has its own.
const (
	actionBulkCreate = "outbox.bulk.create"
	actionBulkChunk  = audit.BulkChunkAction
	actionBulkCancel = "outbox.bulk.cancel"
	actionBulkEnd    = "outbox.bulk." // + done, cancelled or failed
	jobTarget        = "outbox_job"
	// runnerActor names the console's job runner in the audit trail: the
	// person who asked is in the row that opened the job.
	runnerActor = "console job runner"
)

// newJobRunner builds the console's bulk job runner. Every console replica
// runs one; the job lease keeps two from working one job at once.
func (a *App) newJobRunner(extra outbox.ChunkHook) (*outbox.JobRunner, error) {
	hook := auditChunk
	if extra != nil {
		hook = func(ctx context.Context, tx pgx.Tx, j outbox.Job, ids []uuid.UUID) error {
			if err := auditChunk(ctx, tx, j, ids); err != nil {
				return err
			}
			return extra(ctx, tx, j, ids)
		}
	}
	return outbox.NewJobRunner(a.pool, outbox.JobRunnerConfig{
		Hook:  hook,
		OnEnd: auditJobEnd,
		// Progress shows on the jobs pages at the next snapshot; poke the
		// feed so that is now rather than at the next tick.
		OnProgress: func(outbox.Job) { a.feed.Poke() },
	}, a.log)
}

// auditChunk writes a chunk's audit row in the chunk's transaction: the
// events it changed, so the chunk rows of a job add up to exactly what
// the job did.
func auditChunk(ctx context.Context, tx pgx.Tx, j outbox.Job, ids []uuid.UUID) error {
	after, err := json.Marshal(map[string]any{"kind": j.Kind, "count": len(ids), "ids": ids})
	if err != nil {
		return err
	}
	return audit.Record(ctx, tx, audit.Event{
		ActorName: runnerActor, Action: actionBulkChunk, TargetType: jobTarget, TargetID: j.ID.String(),
		After: after, Reason: j.Reason, Outcome: audit.OutcomeOK,
	})
}

// withMatched adds j's matched count to an audit row's after: "matched",
// and "matched_more_than" when the count stopped there and matched is the
// planner's estimate (outbox.Job.Matched).
func withMatched(j outbox.Job, after map[string]any) map[string]any {
	after["matched"] = j.Matched
	if j.MatchedMoreThan > 0 {
		after["matched_more_than"] = j.MatchedMoreThan
	}
	return after
}

// auditJobEnd writes the row that closes a job, in the transaction that
// ends it (so a job closes once).
func auditJobEnd(ctx context.Context, tx pgx.Tx, j outbox.Job) error {
	after, err := json.Marshal(withMatched(j, map[string]any{"kind": j.Kind, "state": j.State,
		"done": j.Done, "skipped": j.Skipped}))
	if err != nil {
		return err
	}
	ev := audit.Event{
		ActorName: runnerActor, Action: actionBulkEnd + j.State, TargetType: jobTarget, TargetID: j.ID.String(),
		After: after, Reason: j.Reason, Outcome: audit.OutcomeOK,
	}
	if j.State == outbox.JobFailed {
		ev.Outcome, ev.ErrorCode = audit.OutcomeError, "chunk_failed"
	}
	return audit.Record(ctx, tx, ev)
}

// jobsShown is how many jobs the list shows.
const jobsShown = 50

func (a *App) jobsPage(c echo.Context) error {
	jobs, err := outbox.ListJobs(c.Request().Context(), a.pool, jobsShown)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.Jobs(a.page(c, "Jobs", "/jobs"), views.JobsData{Jobs: jobs}))
}

// jobID parses the route's job id; a malformed one is a page that does not
// exist.
func jobID(c echo.Context) (uuid.UUID, error) {
	id, err := uuid.Parse(c.Param("id"))
	if err != nil {
		return uuid.Nil, fmt.Errorf("%w: job id", ErrNotFound)
	}
	return id, nil
}

func (a *App) jobPage(c echo.Context) error {
	id, err := jobID(c)
	if err != nil {
		return err
	}
	j, err := outbox.GetJob(c.Request().Context(), a.pool, id)
	if err != nil {
		return jobError(err)
	}
	d := views.JobData{Job: j, Cancellable: !j.Finished() && auth.SessionFrom(c).Can(auth.PermOutboxAct)}
	if c.QueryParam("done") == "already" {
		d.Notice = "This dry run's confirmation started this job already; sending it again changed nothing. Run a new dry run to act on what matches now."
	}
	return render(c, http.StatusOK, views.Job(a.page(c, "Job "+views.ShortID(id.String()), "/jobs"), d))
}

// cancelJob asks a job to stop before its next chunk: compare-and-set on
// its unfinished state, audited with the request in one transaction. A
// pending job ends at once, so its closing row is written there too.
func (a *App) cancelJob(c echo.Context) error {
	id, err := jobID(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	sess := auth.SessionFrom(c)
	var j outbox.Job
	err = db.WithTx(ctx, a.pool, func(tx pgx.Tx) error {
		var err error
		if j, err = outbox.CancelJob(ctx, tx, id); err != nil {
			return err
		}
		ev := a.actorEvent(c, sess, actionBulkCancel, jobTarget, id.String())
		ev.After, _ = json.Marshal(withMatched(j, map[string]any{"state": j.State, "done": j.Done}))
		if err := audit.Record(ctx, tx, ev); err != nil {
			return err
		}
		if j.State == outbox.JobCancelled {
			return auditJobEnd(ctx, tx, j)
		}
		return nil
	})
	if errors.Is(err, outbox.ErrJobFinished) {
		if aerr := a.auditFailed(c, sess, actionBulkCancel, id.String(), "job_finished"); aerr != nil {
			return aerr
		}
		a.metrics.actions.WithLabelValues(actionBulkCancel, "conflict").Inc()
		return &shownError{err: fmt.Errorf("%w: %w", ErrConflict, err),
			msg: "This job has already ended (" + j.State + "); there is nothing to cancel."}
	}
	if err != nil {
		return jobError(err)
	}
	a.metrics.actions.WithLabelValues(actionBulkCancel, audit.OutcomeOK).Inc()
	a.feed.Poke()
	return c.Redirect(http.StatusSeeOther, "/jobs/"+id.String())
}

// jobError puts the outbox's job errors into the console's taxonomy.
func jobError(err error) error {
	switch {
	case errors.Is(err, outbox.ErrJobNotFound):
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case errors.Is(err, outbox.ErrJobFinished), errors.Is(err, outbox.ErrConflict):
		return fmt.Errorf("%w: %w", ErrConflict, err)
	case errors.Is(err, outbox.ErrInvalidFilter), errors.Is(err, outbox.ErrInvalidAction):
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return err
}

// auditFailed records a failed attempt (a conflict) in its own
// transaction: the attempt's own transaction rolled back.
func (a *App) auditFailed(c echo.Context, sess *auth.Session, action, jobID, code string) error {
	ev := a.actorEvent(c, sess, action, jobTarget, jobID)
	ev.Outcome, ev.ErrorCode = audit.OutcomeError, code
	ctx := context.WithoutCancel(c.Request().Context())
	return db.WithTx(ctx, a.pool, func(tx pgx.Tx) error { return audit.Record(ctx, tx, ev) })
}

// actorEvent is an audit event of the signed-in user's request.
func (a *App) actorEvent(c echo.Context, sess *auth.Session, action, targetType, targetID string) audit.Event {
	meta := requestMeta(c)
	return audit.Event{
		ActorIss: sess.Issuer, ActorSub: sess.Subject, ActorName: sess.Name, ActorRoles: sess.RoleNames(),
		SessionHash: sess.HashHex(), IP: meta.IP, UserAgent: meta.UserAgent, RequestID: meta.RequestID,
		Action: action, TargetType: targetType, TargetID: targetID, Outcome: audit.OutcomeOK,
	}
}

// bulkActions reads the chunk rows of the bulk jobs that changed the events
// (each event's newest limit) and gives each as the action the job applied
// to that event: its kind as that action's audit name ("outbox." + kind is
// the single action's name: outbox.retry, outbox.dead_letter,
// outbox.discard; outbox.replay exists only as a job), the person who asked
// for the job as its actor. Without them an event a job retried, discarded
// or replayed read "No console action has touched this event". The
// returned refs map each chunk row's seq to its job, for the pages to say
// "via bulk job" (a link when jobLinks: the user may open jobs). Each event's actions
// come newest first.
func (a *App) bulkActions(ctx context.Context, jobLinks bool, ids []string, limit int) (map[string][]audit.Entry, map[int64]views.BulkRef, error) {
	chunks, err := audit.ChunksNaming(ctx, a.pool, ids, limit)
	if err != nil || len(chunks) == 0 {
		return nil, nil, err
	}
	who := map[string]string{} // job id → who asked for it
	events := map[string][]audit.Entry{}
	refs := map[int64]views.BulkRef{}
	for _, ch := range chunks {
		name, seen := who[ch.Job]
		if !seen {
			name = runnerActor // the job's row is gone or unreadable: the chunk's own actor
			if id, err := uuid.Parse(ch.Job); err == nil {
				j, err := outbox.GetJob(ctx, a.pool, id)
				switch {
				case err == nil:
					name = j.RequestedBy
				case !errors.Is(err, outbox.ErrJobNotFound):
					return nil, nil, err
				}
			}
			who[ch.Job] = name
		}
		e := ch.Entry
		e.Action = "outbox." + ch.Kind
		e.ActorName, e.ActorSub, e.ActorRoles = name, "", nil
		events[ch.Event] = append(events[ch.Event], e)
		ref := views.BulkRef{Job: ch.Job}
		if jobLinks {
			ref.URL = "/jobs/" + ch.Job
		}
		refs[e.Seq] = ref
	}
	return events, refs, nil
}

// withBulk merges an event's own audit rows with its bulk jobs' actions,
// newest first, the newest limit of them.
func withBulk(own, bulk []audit.Entry, limit int) []audit.Entry {
	all := append(append(make([]audit.Entry, 0, len(own)+len(bulk)), own...), bulk...)
	slices.SortStableFunc(all, func(x, y audit.Entry) int { return cmp.Compare(y.Seq, x.Seq) })
	if len(all) > limit {
		all = all[:limit]
	}
	return all
}
