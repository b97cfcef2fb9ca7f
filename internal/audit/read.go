package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Entry is one audit row as the console shows it (no hashes, no session
// hash, ip or user agent: a detail page names who did what, when, why).
type Entry struct {
	Seq        int64
	OccurredAt time.Time
	ActorIss   string
	ActorSub   string
	ActorName  string
	ActorRoles []string
	Action     string
	Before     json.RawMessage
	After      json.RawMessage
	Reason     string
	RequestID  string
	Outcome    string
	ErrorCode  string
}

// MaxForTarget bounds ForTarget.
const MaxForTarget = 500

// ForTarget lists the newest limit (at most MaxForTarget) audit rows about
// one target, newest first, along audit_event_target_idx.
func ForTarget(ctx context.Context, q Querier, targetType, targetID string, limit int) ([]Entry, error) {
	return ForTargets(ctx, q, targetType, []string{targetID}, limit)
}

// ForTargets is ForTarget for several targets of one type in one statement
// (the newest limit rows of each, one walk of audit_event_target_idx per
// target), target by target in the order given, each newest first.
func ForTargets(ctx context.Context, q Querier, targetType string, targetIDs []string, limit int) ([]Entry, error) {
	if limit <= 0 || limit > MaxForTarget {
		limit = MaxForTarget
	}
	rows, err := q.Query(ctx, `
		SELECT a.seq, a.occurred_at, a.actor_iss, a.actor_sub, a.actor_name, a.actor_roles, a.action,
		       a.before, a.after, a.reason, a.request_id, a.outcome, a.error_code
		  FROM unnest($2::text[]) WITH ORDINALITY t(id, n)
		 CROSS JOIN LATERAL (
		        SELECT * FROM audit_event
		         WHERE target_type = $1 AND target_id = t.id
		         ORDER BY seq DESC
		         LIMIT $3) a
		 ORDER BY t.n, a.seq DESC`, targetType, targetIDs, limit)
	if err != nil {
		return nil, fmt.Errorf("audit: for %d %s target(s): %w", len(targetIDs), targetType, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Entry, error) {
		var e Entry
		err := r.Scan(&e.Seq, &e.OccurredAt, &e.ActorIss, &e.ActorSub, &e.ActorName, &e.ActorRoles, &e.Action,
			&e.Before, &e.After, &e.Reason, &e.RequestID, &e.Outcome, &e.ErrorCode)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("audit: for %d %s target(s): %w", len(targetIDs), targetType, err)
	}
	return out, nil
}
