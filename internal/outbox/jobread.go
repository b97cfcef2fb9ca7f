package outbox

import (
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/db"
)

// JobProgress is a bulk job's progress as the live feed shows it.
type JobProgress struct {
	ID              uuid.UUID  `json:"id"`
	Kind            string     `json:"kind"`
	State           string     `json:"state"`
	Matched         int64      `json:"matched"`
	MatchedMoreThan int64      `json:"matched_more_than"` // see Job.Matched
	Done            int64      `json:"done"`
	Skipped         int64      `json:"skipped"`
	CancelRequested bool       `json:"cancel_requested"`
	StartedAt       *time.Time `json:"started_at"`
	FinishedAt      *time.Time `json:"finished_at"`
}

// MatchedTotal is Matched as a Total (Job.MatchedTotal).
func (p JobProgress) MatchedTotal() Total {
	return Job{Matched: p.Matched, MatchedMoreThan: p.MatchedMoreThan}.MatchedTotal()
}

// Finished reports whether the job has ended.
func (p JobProgress) Finished() bool {
	return p.State == JobDone || p.State == JobCancelled || p.State == JobFailed
}

// Progress is j's progress.
func (j Job) Progress() JobProgress {
	return JobProgress{ID: j.ID, Kind: j.Kind, State: j.State, Matched: j.Matched, MatchedMoreThan: j.MatchedMoreThan, Done: j.Done, Skipped: j.Skipped,
		CancelRequested: j.CancelRequested, StartedAt: j.StartedAt, FinishedAt: j.FinishedAt}
}

// JobsRead lists the unfinished jobs (outbox_job_runnable_idx) and the
// Recent newest jobs (a backward walk of the primary key), newest first, as
// a db.Read part: O(unfinished jobs + Recent), never the job history. The
// newest jobs are included so a job that has just ended is still shown in
// its final state.
type JobsRead struct {
	Recent int
	Jobs   []JobProgress
}

// Expr implements db.Read.
func (r *JobsRead) Expr(args *db.Args) string {
	return `SELECT coalesce(json_agg(json_build_object('id', j.id, 'kind', j.kind, 'state', j.state,
	                                 'matched', j.matched, 'matched_more_than', coalesce(j.matched_more_than, 0),
	                                 'done', j.done, 'skipped', j.skipped,
	                                 'cancel_requested', j.cancel_requested_at IS NOT NULL,
	                                 'started_at', j.started_at, 'finished_at', j.finished_at)
	                                 ORDER BY j.id DESC), '[]')
	  FROM (SELECT ` + jobReadColumns + ` FROM outbox_job WHERE state IN ('pending', 'running')
	        UNION
	        (SELECT ` + jobReadColumns + ` FROM outbox_job ORDER BY id DESC LIMIT ` + db.Int(r.Recent) + `)) j`
}

const jobReadColumns = `id, kind, state, matched, matched_more_than, done, skipped, cancel_requested_at, started_at, finished_at`

// Scan implements db.Read.
func (r *JobsRead) Scan(src []byte) error {
	r.Jobs = nil
	if err := db.ScanJSON(src, &r.Jobs); err != nil {
		return fmt.Errorf("outbox: jobs: %w", err)
	}
	return nil
}
