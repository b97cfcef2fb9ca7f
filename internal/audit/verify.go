package audit

import (
	"bytes"
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Querier is what Verify reads through (a pool, a connection or a tx).
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// VerifyResult is the outcome of walking the chain.
type VerifyResult struct {
	Checked     int64  // rows walked
	FirstBroken int64  // seq of the first row whose link or hash is wrong; 0 when intact
	Problem     string // what is wrong with FirstBroken
	HeadSeq     int64  // last row of an intact chain
	HeadHash    []byte // its hash: keep it outside the database to detect truncation of the tail
}

// Intact reports whether every row checked out.
func (r VerifyResult) Intact() bool { return r.FirstBroken == 0 }

// Verify recomputes the chain in seq order and reports the first row whose
// prev_hash is not its predecessor's hash (a deleted or reordered row) or
// whose hash does not match its contents (an edited row). It streams the
// table, so memory stays flat whatever its size.
func Verify(ctx context.Context, q Querier) (VerifyResult, error) {
	return VerifyProgress(ctx, q, 0, nil)
}

// Progress is called by VerifyProgress as it walks: rows checked so far and
// the last seq checked. An error stops the walk.
type Progress func(checked, seq int64) error

// VerifyProgress is Verify calling progress after every `every` rows (never
// when every <= 0 or progress is nil), so a long walk can report and be
// stopped (the console's verification job).
func VerifyProgress(ctx context.Context, q Querier, every int64, progress Progress) (VerifyResult, error) {
	return walk(ctx, q, nil, genesis, every, progress)
}

// walk verifies the rows after seq *after (every row when after is nil:
// a row inserted with a seq of 0 or below is still one to check), the
// first of which must follow prev (genesis from the start). HeadSeq and
// HeadHash are the last row checked (zero when there is none after).
func walk(ctx context.Context, q Querier, after *int64, prev []byte, every int64, progress Progress) (VerifyResult, error) {
	sql, args := `SELECT `+rowColumns+` FROM audit_event ORDER BY seq`, []any(nil)
	if after != nil {
		sql, args = `SELECT `+rowColumns+` FROM audit_event WHERE seq > $1 ORDER BY seq`, []any{*after}
	}
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return VerifyResult{}, fmt.Errorf("audit: verify: %w", err)
	}
	defer rows.Close()
	var res VerifyResult
	for rows.Next() {
		r, prevHash, hash, err := scanRow(rows)
		if err != nil {
			return VerifyResult{}, fmt.Errorf("audit: verify: %w", err)
		}
		res.Checked++
		switch {
		case !bytes.Equal(prevHash, prev):
			res.FirstBroken, res.Problem = r.Seq, "prev_hash does not match the previous row (a row was deleted, inserted or reordered)"
		case !bytes.Equal(chainHash(prevHash, &r), hash):
			res.FirstBroken, res.Problem = r.Seq, "hash does not match the row's contents (the row was edited)"
		}
		if res.FirstBroken != 0 {
			return res, nil
		}
		prev = hash
		res.HeadSeq, res.HeadHash = r.Seq, hash
		if progress != nil && every > 0 && res.Checked%every == 0 {
			if err := progress(res.Checked, r.Seq); err != nil {
				return VerifyResult{}, fmt.Errorf("audit: verify: %w", err)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return VerifyResult{}, fmt.Errorf("audit: verify: %w", err)
	}
	return res, nil
}

// rowColumns are an audit_event row as scanRow reads it.
const rowColumns = `seq, occurred_at, actor_iss, actor_sub, actor_name, actor_roles, action,
	target_type, target_id, before::text, after::text, reason, evidence, request_id,
	session_hash, ip, user_agent, outcome, error_code, prev_hash, hash`

func scanRow(rows pgx.Rows) (r row, prevHash, hash []byte, err error) {
	err = rows.Scan(&r.Seq, &r.OccurredAt, &r.ActorIss, &r.ActorSub, &r.ActorName, &r.ActorRoles,
		&r.Action, &r.TargetType, &r.TargetID, &r.Before, &r.After, &r.Reason, &r.Evidence,
		&r.RequestID, &r.SessionHash, &r.IP, &r.UserAgent, &r.Outcome, &r.ErrorCode, &prevHash, &hash)
	return r, prevHash, hash, err
}
