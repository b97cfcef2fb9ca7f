package web

import (
	"context"
	"errors"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/db"
)

// verifier runs the chain verifications asked for from the console, one at
// a time (the table allows one running row), in the background of the
// process that accepted the request: POST /audit/verify opens the row and
// hands its id over; Run walks the chain until the console stops.
type verifier struct {
	pool     *pgxpool.Pool
	log      *slog.Logger
	every    int64  // rows between progress updates
	progress func() // after each progress update and at the end (wakes the live feed)
	queue    chan int64
}

func newVerifier(pool *pgxpool.Pool, log *slog.Logger, every int64, progress func()) *verifier {
	return &verifier{pool: pool, log: log, every: every, progress: progress, queue: make(chan int64, 1)}
}

// Run works the queue until ctx ends. A verification cut by the end of ctx
// is recorded as failed.
func (v *verifier) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case id := <-v.queue:
			res, err := audit.RunVerification(ctx, v.pool, v.pool, id, v.every, v.progress)
			if err != nil {
				v.log.Error("audit verification failed", "id", id, "err", err)
			} else {
				v.log.Info("audit verification ended", "id", id, "state", res.State, "checked", res.Checked)
			}
			v.progress()
		}
	}
}

// enqueue hands a verification to Run. The row allows one running
// verification, so the queue (one slot) is never full when a new row was
// opened; if it were, the row is left running and closes as abandoned.
func (v *verifier) enqueue(id int64) bool {
	select {
	case v.queue <- id:
		return true
	default:
		return false
	}
}

// Notices of ?verify= after a request (fixed texts: the query never reaches
// the page).
func verifyNotice(code string) string {
	switch code {
	case "started":
		return "Verification started: it walks the whole chain in the background; this section updates as it goes."
	case "running":
		return "A verification is already running; its result shows here when it ends."
	}
	return ""
}

// auditVerify is POST /audit/verify: it opens a verification and its audit
// row in one transaction, then hands it to the verifier. A request while one
// runs is a conflict, audited in its own transaction.
func (a *App) auditVerify(c echo.Context) error {
	ctx := c.Request().Context()
	sess := auth.SessionFrom(c)
	ev := a.actorEvent(c, sess, audit.ActionVerify, audit.TargetVerification, "")
	by := sess.Name
	if by == "" {
		by = sess.Subject
	}
	v, err := db.WithTxV(ctx, a.pool, func(tx pgx.Tx) (audit.Verification, error) {
		return audit.StartVerification(ctx, tx, by, ev)
	})
	if errors.Is(err, audit.ErrVerificationRunning) {
		a.metrics.actions.WithLabelValues(audit.ActionVerify, "conflict").Inc()
		ev.Outcome, ev.ErrorCode = audit.OutcomeError, "running"
		actx := context.WithoutCancel(ctx)
		if err := db.WithTx(actx, a.pool, func(tx pgx.Tx) error { return audit.Record(actx, tx, ev) }); err != nil {
			return err
		}
		return c.Redirect(http.StatusSeeOther, "/audit?verify=running")
	}
	if err != nil {
		return err
	}
	a.metrics.actions.WithLabelValues(audit.ActionVerify, audit.OutcomeOK).Inc()
	if !a.verifier.enqueue(v.ID) {
		a.log.Error("audit verification not queued: the verifier is busy", "id", v.ID)
	}
	a.feed.Poke()
	return c.Redirect(http.StatusSeeOther, "/audit?verify=started")
}
