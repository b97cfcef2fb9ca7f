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
	if limit <= 0 || limit > MaxForTarget {
		limit = MaxForTarget
	}
	rows, err := q.Query(ctx, `
		SELECT seq, occurred_at, actor_iss, actor_sub, actor_name, actor_roles, action,
		       before, after, reason, request_id, outcome, error_code
		  FROM audit_event
		 WHERE target_type = $1 AND target_id = $2
		 ORDER BY seq DESC
		 LIMIT $3`, targetType, targetID, limit)
	if err != nil {
		return nil, fmt.Errorf("audit: for target %s %s: %w", targetType, targetID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Entry, error) {
		var e Entry
		err := r.Scan(&e.Seq, &e.OccurredAt, &e.ActorIss, &e.ActorSub, &e.ActorName, &e.ActorRoles, &e.Action,
			&e.Before, &e.After, &e.Reason, &e.RequestID, &e.Outcome, &e.ErrorCode)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("audit: for target %s %s: %w", targetType, targetID, err)
	}
	return out, nil
}
