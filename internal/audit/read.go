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

// BulkChunkAction is the action of a bulk job's chunk row: its target is
// the job, its after lists the events the chunk changed ("ids", with the
// job's "kind"). audit_event_bulk_ids_idx (migration 00033) indexes those
// ids for the rows of this action only.
const BulkChunkAction = "outbox.bulk.chunk"

// chunksNamingSQL is ChunksNaming's statement: $1 the event ids, $2 the
// limit per event.
const chunksNamingSQL = `
		SELECT t.id, a.target_id, coalesce(a.after ->> 'kind', ''),
		       a.seq, a.occurred_at, a.actor_iss, a.actor_sub, a.actor_name, a.actor_roles, a.action,
		       a.before, a.after, a.reason, a.request_id, a.outcome, a.error_code
		  FROM unnest($1::text[]) WITH ORDINALITY t(id, n)
		 CROSS JOIN LATERAL (
		        SELECT * FROM audit_event
		         WHERE action = 'outbox.bulk.chunk' AND after -> 'ids' @> jsonb_build_array(t.id)
		         ORDER BY seq DESC
		         LIMIT $2) a
		 ORDER BY t.n, a.seq DESC`

// A Chunk is a bulk job's chunk row that changed one of the events asked
// for.
type Chunk struct {
	Entry
	Event string // the event asked for that the chunk changed
	Job   string // the chunk row's target: the job's id
	Kind  string // the job's kind, from the row's after
}

// ChunksNaming lists, for each event id, the newest limit (at most
// MaxForTarget) chunk rows whose ids name it, event by event in the order
// given, each newest first: the bulk jobs' actions on the events, which
// ForTargets does not see since their rows target the job. One probe of
// audit_event_bulk_ids_idx per id (the action is written out in the SQL so
// the partial index's predicate matches on any plan).
func ChunksNaming(ctx context.Context, q Querier, eventIDs []string, limit int) ([]Chunk, error) {
	if limit <= 0 || limit > MaxForTarget {
		limit = MaxForTarget
	}
	rows, err := q.Query(ctx, chunksNamingSQL, eventIDs, limit)
	if err != nil {
		return nil, fmt.Errorf("audit: chunks naming %d event(s): %w", len(eventIDs), err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Chunk, error) {
		var c Chunk
		e := &c.Entry
		err := r.Scan(&c.Event, &c.Job, &c.Kind, &e.Seq, &e.OccurredAt, &e.ActorIss, &e.ActorSub, &e.ActorName,
			&e.ActorRoles, &e.Action, &e.Before, &e.After, &e.Reason, &e.RequestID, &e.Outcome, &e.ErrorCode)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("audit: chunks naming %d event(s): %w", len(eventIDs), err)
	}
	return out, nil
}
