package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
)

// States of a verification started from the console.
const (
	VerificationRunning = "running"
	VerificationIntact  = "intact"
	VerificationBroken  = "broken"
	VerificationFailed  = "failed" // it could not finish (database error, the console stopped)
)

// Audit actions and target of a verification: the request (by the person
// who asked) and its end (by the console's verifier), in the transaction
// that records each.
const (
	ActionVerify       = "audit.verify"
	ActionVerifyEnd    = "audit.verify." // + intact, broken or failed
	TargetVerification = "audit_verification"
	// VerifierActor names the console's verifier in the trail.
	VerifierActor = "console audit verifier"
)

// ErrVerificationRunning reports a verification asked for while another
// one runs.
var ErrVerificationRunning = errors.New("audit: a verification is already running")

// Verification is one chain verification started from the console.
type Verification struct {
	ID             int64      `json:"id"`
	RequestedBy    string     `json:"requested_by"`
	StartedAt      time.Time  `json:"started_at"`
	HeartbeatAt    time.Time  `json:"heartbeat_at"`
	FinishedAt     *time.Time `json:"finished_at"`
	State          string     `json:"state"`
	Checked        int64      `json:"checked"`
	HeadSeq        *int64     `json:"head_seq"` // the last row checked
	FirstBrokenSeq *int64     `json:"first_broken_seq"`
	Problem        string     `json:"problem"`
}

// Finished reports whether v has ended.
func (v Verification) Finished() bool { return v.State != VerificationRunning }

// VerificationStale is how long a running verification may go without a
// heartbeat before it counts as abandoned (its console stopped mid-walk): a
// new request then marks it failed instead of waiting for it forever.
const VerificationStale = 2 * time.Minute

const verificationColumns = `id, requested_by, started_at, heartbeat_at, finished_at, state, checked,
	head_seq, first_broken_seq, problem`

func scanVerification(r pgx.Row) (Verification, error) {
	var v Verification
	err := r.Scan(&v.ID, &v.RequestedBy, &v.StartedAt, &v.HeartbeatAt, &v.FinishedAt, &v.State, &v.Checked,
		&v.HeadSeq, &v.FirstBrokenSeq, &v.Problem)
	return v, err
}

// StartVerification opens a verification row in tx (running) and writes the
// request's audit event ev (action ActionVerify, target the new row) in the
// same transaction. A running verification whose heartbeat is older than
// VerificationStale is closed as failed first; a live one makes it
// ErrVerificationRunning and nothing is written.
func StartVerification(ctx context.Context, tx pgx.Tx, requestedBy string, ev Event) (Verification, error) {
	if _, err := tx.Exec(ctx, `
		UPDATE audit_verification
		   SET state = 'failed', finished_at = clock_timestamp(),
		       problem = 'abandoned: the console running it stopped before it finished'
		 WHERE state = 'running' AND heartbeat_at < clock_timestamp() - make_interval(secs => $1)`,
		VerificationStale.Seconds()); err != nil {
		return Verification{}, fmt.Errorf("audit: close an abandoned verification: %w", err)
	}
	v, err := scanVerification(tx.QueryRow(ctx, `
		INSERT INTO audit_verification (requested_by) VALUES ($1)
		ON CONFLICT ((true)) WHERE state = 'running' DO NOTHING
		RETURNING `+verificationColumns, requestedBy))
	if errors.Is(err, pgx.ErrNoRows) {
		return Verification{}, ErrVerificationRunning
	}
	if err != nil {
		return Verification{}, fmt.Errorf("audit: start a verification: %w", err)
	}
	ev.Action, ev.TargetType, ev.TargetID = ActionVerify, TargetVerification, strconv.FormatInt(v.ID, 10)
	if err := Record(ctx, tx, ev); err != nil {
		return Verification{}, err
	}
	return v, nil
}

// LatestVerification is the newest verification; ok is false when none was
// ever started.
func LatestVerification(ctx context.Context, q db.Querier) (v Verification, ok bool, err error) {
	v, err = scanVerification(q.QueryRow(ctx, `SELECT `+verificationColumns+` FROM audit_verification ORDER BY id DESC LIMIT 1`))
	if errors.Is(err, pgx.ErrNoRows) {
		return Verification{}, false, nil
	}
	if err != nil {
		return Verification{}, false, fmt.Errorf("audit: latest verification: %w", err)
	}
	return v, true, nil
}

// VerifyEvery is how many rows RunVerification walks between progress
// updates (and heartbeats).
const VerifyEvery = 10_000

// RunVerification walks the chain for the running verification id, records
// its progress every `every` rows (onProgress is then called, e.g. to push
// it to the pages), and ends it intact, broken (naming the first broken seq)
// or failed, with the end's audit event in the same transaction. A
// cancelled ctx ends it failed (recorded with a context that is not
// cancelled).
func RunVerification(ctx context.Context, pool db.Beginner, q db.Querier, id int64, every int64, onProgress func()) (Verification, error) {
	if every <= 0 {
		every = VerifyEvery
	}
	res, verr := VerifyProgress(ctx, q, every, func(checked, seq int64) error {
		if _, err := q.Exec(ctx, `UPDATE audit_verification SET checked = $2, head_seq = $3, heartbeat_at = clock_timestamp()
			WHERE id = $1 AND state = 'running'`, id, checked, seq); err != nil {
			return err
		}
		if onProgress != nil {
			onProgress()
		}
		return nil
	})
	state, problem := VerificationIntact, ""
	var broken *int64
	switch {
	case verr != nil:
		state, problem = VerificationFailed, "the walk stopped before the end: "+failure(ctx)
	case !res.Intact():
		state, problem, broken = VerificationBroken, res.Problem, &res.FirstBroken
	}
	var head *int64
	if res.HeadSeq != 0 {
		head = &res.HeadSeq
	}
	fctx := context.WithoutCancel(ctx)
	v, err := db.WithTxV(fctx, pool, func(tx pgx.Tx) (Verification, error) {
		v, err := scanVerification(tx.QueryRow(fctx, `
			UPDATE audit_verification
			   SET state = $2, finished_at = clock_timestamp(), heartbeat_at = clock_timestamp(),
			       checked = CASE WHEN $2 = 'failed' THEN checked ELSE $3 END,
			       head_seq = CASE WHEN $2 = 'failed' THEN head_seq ELSE $4 END,
			       first_broken_seq = $5, problem = $6
			 WHERE id = $1 AND state = 'running'
			RETURNING `+verificationColumns, id, state, res.Checked, head, broken, problem))
		if errors.Is(err, pgx.ErrNoRows) {
			return Verification{}, fmt.Errorf("audit: verification %d is not running (closed as abandoned?)", id)
		}
		if err != nil {
			return Verification{}, fmt.Errorf("audit: finish verification %d: %w", id, err)
		}
		after, _ := json.Marshal(map[string]any{"state": v.State, "checked": v.Checked, "head_seq": v.HeadSeq,
			"first_broken_seq": v.FirstBrokenSeq, "problem": v.Problem}) // plain values: Marshal cannot fail
		ev := Event{ActorName: VerifierActor, Action: ActionVerifyEnd + state, TargetType: TargetVerification,
			TargetID: strconv.FormatInt(id, 10), After: after, Outcome: OutcomeOK}
		if state == VerificationFailed {
			ev.Outcome, ev.ErrorCode = OutcomeError, "verify_failed"
		}
		return v, Record(fctx, tx, ev)
	})
	if err != nil {
		return v, err
	}
	return v, verr // recorded as failed; the caller logs what happened
}

// failure is the stored problem of a walk that failed: what happened, never
// driver detail (the row is shown on the audit pages).
func failure(ctx context.Context) string {
	if ctx.Err() != nil {
		return "the console stopped"
	}
	return "a database error (see the console's log)"
}

// ChainStatus is what the audit pages show about the chain: the newest
// verification (running or ended) and the newest that ended intact or
// broken.
type ChainStatus struct {
	Latest       *Verification `json:"latest"`
	LastVerified *Verification `json:"last_verified"`
}

// ChainStatusRead reads ChainStatus as a db.Read part (two probes of
// audit_verification's primary key), so the live feed composes it into its
// one statement per tick and a page reads it alone with the same SQL.
type ChainStatusRead struct {
	Status ChainStatus
}

// Expr implements db.Read.
func (r *ChainStatusRead) Expr(*db.Args) string {
	return `SELECT json_build_object(
	  'latest', (SELECT row_to_json(v) FROM (SELECT ` + verificationColumns + ` FROM audit_verification
	              ORDER BY id DESC LIMIT 1) v),
	  'last_verified', (SELECT row_to_json(v) FROM (SELECT ` + verificationColumns + ` FROM audit_verification
	              WHERE state IN ('intact', 'broken') ORDER BY id DESC LIMIT 1) v))`
}

// Scan implements db.Read.
func (r *ChainStatusRead) Scan(src []byte) error {
	r.Status = ChainStatus{}
	if err := db.ScanJSON(src, &r.Status); err != nil {
		return fmt.Errorf("audit: chain status: %w", err)
	}
	return nil
}

// ReadChainStatus reads the chain's status on its own.
func ReadChainStatus(ctx context.Context, q db.RowQuerier) (ChainStatus, error) {
	var r ChainStatusRead
	if _, err := db.ReadAll(ctx, q, &r); err != nil {
		return ChainStatus{}, err
	}
	return r.Status, nil
}
