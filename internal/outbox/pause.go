package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/db"
)

// Pausing a topic stops the relays from claiming its events: each claim
// reads the paused topics (outbox_topic_pause, a handful of rows) and skips
// them, so a pause takes effect at every relay's next claim (a batch already
// claimed is still published). The events keep accumulating as pending and
// are published, in order, after a resume. With ordering on, an aggregate's
// later events in other topics are held behind its paused pending ones by
// the claim's ordering check, exactly as behind any pending event: a pause
// never lets an aggregate overtake itself.

// TopicPause is a paused topic: who paused it, when and why.
type TopicPause struct {
	Topic    string    `json:"topic"`
	PausedBy string    `json:"paused_by"`
	PausedAt time.Time `json:"paused_at"`
	Reason   string    `json:"reason"`
}

// TopicConflictError is ErrConflict for a pause of a paused topic or a
// resume of a running one. Paused is the pause as it is now (nil: the topic
// is not paused).
type TopicConflictError struct {
	Topic  string
	Action string // "pause" or "resume"
	Paused *TopicPause
}

func (e *TopicConflictError) Error() string {
	if e.Paused != nil {
		return fmt.Sprintf("outbox: cannot %s topic %q: it is already paused (by %s)", e.Action, e.Topic, e.Paused.PausedBy)
	}
	return fmt.Sprintf("outbox: cannot %s topic %q: it is not paused", e.Action, e.Topic)
}

func (e *TopicConflictError) Unwrap() error { return ErrConflict }

// ValidTopic refuses a topic name no event could have (as Insert does).
func ValidTopic(topic string) error {
	if topic == "" || len(topic) > 200 || !utf8.ValidString(topic) || strings.ContainsRune(topic, 0) {
		return fmt.Errorf("%w: topic must be 1–200 characters", ErrInvalidAction)
	}
	return nil
}

const pauseColumns = `topic, paused_by, paused_at, reason`

// PauseTopic pauses topic (reason and actor required) in q, which should be
// the transaction that records the audit row. Pausing a paused topic is a
// *TopicConflictError carrying the current pause, and changes nothing. A
// topic with no events yet may be paused: its first events then wait.
func PauseTopic(ctx context.Context, q db.Querier, topic, by, reason string) (TopicPause, error) {
	if err := ValidTopic(topic); err != nil {
		return TopicPause{}, err
	}
	if strings.TrimSpace(reason) == "" {
		return TopicPause{}, fmt.Errorf("%w: pause needs a reason", ErrInvalidAction)
	}
	if by == "" {
		return TopicPause{}, fmt.Errorf("%w: pause needs its actor", ErrInvalidAction)
	}
	var p TopicPause
	err := q.QueryRow(ctx, `INSERT INTO outbox_topic_pause (topic, paused_by, reason) VALUES ($1, $2, $3)
		ON CONFLICT (topic) DO NOTHING RETURNING `+pauseColumns, topic, by, reason).
		Scan(&p.Topic, &p.PausedBy, &p.PausedAt, &p.Reason)
	if errors.Is(err, pgx.ErrNoRows) {
		cur, gerr := TopicPaused(ctx, q, topic)
		if gerr != nil {
			return TopicPause{}, gerr
		}
		return TopicPause{}, &TopicConflictError{Topic: topic, Action: "pause", Paused: cur}
	}
	if err != nil {
		return TopicPause{}, fmt.Errorf("outbox: pause %q: %w", topic, err)
	}
	return p, nil
}

// ResumeTopic ends topic's pause in q and returns the pause it ended; the
// relays claim its events again at their next claim (or at once after a
// NOTIFY). Resuming a topic that is not paused is a *TopicConflictError.
func ResumeTopic(ctx context.Context, q db.Querier, topic string) (TopicPause, error) {
	if err := ValidTopic(topic); err != nil {
		return TopicPause{}, err
	}
	var p TopicPause
	err := q.QueryRow(ctx, `DELETE FROM outbox_topic_pause WHERE topic = $1 RETURNING `+pauseColumns, topic).
		Scan(&p.Topic, &p.PausedBy, &p.PausedAt, &p.Reason)
	if errors.Is(err, pgx.ErrNoRows) {
		return TopicPause{}, &TopicConflictError{Topic: topic, Action: "resume"}
	}
	if err != nil {
		return TopicPause{}, fmt.Errorf("outbox: resume %q: %w", topic, err)
	}
	return p, nil
}

// TopicPaused is topic's pause, or nil when it is not paused.
func TopicPaused(ctx context.Context, q db.Querier, topic string) (*TopicPause, error) {
	var p TopicPause
	err := q.QueryRow(ctx, `SELECT `+pauseColumns+` FROM outbox_topic_pause WHERE topic = $1`, topic).
		Scan(&p.Topic, &p.PausedBy, &p.PausedAt, &p.Reason)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("outbox: pause of %q: %w", topic, err)
	}
	return &p, nil
}

// PausedTopics lists the paused topics by name.
func PausedTopics(ctx context.Context, q db.Querier) ([]TopicPause, error) {
	rows, err := q.Query(ctx, `SELECT `+pauseColumns+` FROM outbox_topic_pause ORDER BY topic`)
	if err != nil {
		return nil, fmt.Errorf("outbox: paused topics: %w", err)
	}
	ps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TopicPause, error) {
		var p TopicPause
		err := r.Scan(&p.Topic, &p.PausedBy, &p.PausedAt, &p.Reason)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: paused topics: %w", err)
	}
	return ps, nil
}

// claimFloorSQL is read before every claim, after the claim lock: the paused
// topics; when there are any, the lowest pending id of a topic that is not paused (NULL:
// nothing but paused work is pending). The claim starts its walk of
// outbox_event_pending_idx there, so a paused backlog at the head of the
// index is not read through on every batch. The lowest id per topic comes
// from outbox_event_pending_topic_idx with a loose index scan (one probe per
// pending topic), so the read costs O(topics), never O(backlog). With
// nothing paused it reads one tiny table and nothing else (the EXISTS is a
// one-time filter: the walk does not start). Third, the lowest pending id at
// or after $1, the relay's cursor (Relay.claim), of an event that a claim
// could take now or once a lease ends: where the claim's walk of
// outbox_event_pending_idx may start without passing over the entries of
// events published since (NULL: nothing so from there).
//
// It passes over the events that stay pending without being claimable:
// backing off for more than a second ($2 is the claim's clock, NULL for the
// database's), and, when $3 (ordering), those held behind a dead letter or
// such an event of their aggregate. Stopping at one of those would hold the
// cursor at its id for as long as the event is stuck — a dead letter can
// wait days for an operator — and every claim would walk the entries of
// everything published since (claimCursor says how they are claimed once
// they can be). An event behind one under a live lease is not passed over:
// it is claimable as soon as that one is published. The second of margin
// matters: a new event's available_at is its transaction's start, which can
// be later than this statement's timestamp; passed over as "backing off",
// such events lay below the cursor until a walk from the lowest id (bench
// R2 at 2,500/s: 12,300 events stuck for 15 s); an event with less than a
// second to wait holds the cursor for that second. One probe of
// outbox_event_pending_aggregate_idx per event looked at; the first is
// claimable unless something is stuck.
const claimFloorSQL = `
	WITH RECURSIVE p AS (SELECT coalesce(array_agg(topic), '{}') AS topics FROM outbox_topic_pause),
	t AS (
		(SELECT e.topic, e.id FROM outbox_event e
		  WHERE EXISTS (SELECT 1 FROM outbox_topic_pause) AND e.status = 'pending' AND e.topic > '' ORDER BY e.topic, e.id LIMIT 1)
		UNION ALL
		SELECT n.topic, n.id FROM t,
		       LATERAL (SELECT e.topic, e.id FROM outbox_event e
		                 WHERE e.status = 'pending' AND e.topic > '' AND e.topic > t.topic ORDER BY e.topic, e.id LIMIT 1) n
	)
	SELECT p.topics, (SELECT t.id FROM t WHERE t.topic <> ALL(p.topics) ORDER BY t.id LIMIT 1),
	       (SELECT e.id FROM outbox_event e
	         WHERE e.status = 'pending' AND e.id >= $1::uuid
	           AND NOT (e.available_at > coalesce($2::timestamptz, statement_timestamp()) + interval '1 second'
	                    AND (e.locked_until IS NULL OR e.locked_until < coalesce($2::timestamptz, statement_timestamp())))
	           AND NOT ($3::bool AND EXISTS (
	                 SELECT 1 FROM outbox_event s
	                  WHERE s.status IN ('pending', 'dead')
	                    AND s.aggregate_type = e.aggregate_type
	                    AND s.aggregate_id = e.aggregate_id
	                    AND s.aggregate_seq < e.aggregate_seq
	                    AND (s.status = 'dead'
	                         OR (s.available_at > coalesce($2::timestamptz, statement_timestamp()) + interval '1 second'
	                             AND (s.locked_until IS NULL OR s.locked_until < coalesce($2::timestamptz, statement_timestamp()))))
	                 OFFSET 0))
	         ORDER BY e.id LIMIT 1)
	  FROM p`

// Audit actions of a pause and a resume, the same from the console and the
// command line.
const (
	AuditTopicPause  = "outbox.topic.pause"
	AuditTopicResume = "outbox.topic.resume"
	AuditTargetTopic = "outbox_topic"
)

// SetTopicPaused pauses (pause true) or resumes topic with its audit row in
// one READ COMMITTED transaction: actor is the audit event of whoever asks
// (the console's session or the command line's user), without action,
// target, outcome or reason, which this fills in. A refused attempt (no
// reason, a conflict) is audited in its own transaction with outcome error
// and the code invalid or conflict, so every attempt leaves one row; its
// error is returned as PauseTopic and ResumeTopic return it.
func SetTopicPaused(ctx context.Context, pool *pgxpool.Pool, topic string, pause bool, reason string, actor audit.Event) (TopicPause, error) {
	ev := actor
	ev.Action, ev.TargetType, ev.TargetID, ev.Reason = AuditTopicResume, AuditTargetTopic, topic, reason
	if pause {
		ev.Action = AuditTopicPause
	}
	by := actor.ActorName
	if by == "" {
		by = actor.ActorSub
	}
	var err error
	if strings.TrimSpace(reason) == "" {
		err = fmt.Errorf("%w: %s needs a reason", ErrInvalidAction, strings.TrimPrefix(ev.Action, "outbox.topic."))
	}
	var p TopicPause
	if err == nil {
		p, err = db.WithTxV(ctx, pool, func(tx pgx.Tx) (TopicPause, error) {
			var (
				p   TopicPause
				err error
			)
			ok := ev
			ok.Outcome = audit.OutcomeOK
			if pause {
				p, err = PauseTopic(ctx, tx, topic, by, reason)
				ok.After = pauseJSON(&p)
			} else {
				p, err = ResumeTopic(ctx, tx, topic)
				ok.Before = pauseJSON(&p)
			}
			if err != nil {
				return TopicPause{}, err
			}
			return p, audit.Record(ctx, tx, ok)
		})
	}
	if err == nil {
		if !pause {
			// Wake the relays now rather than at their next poll; best
			// effort (the poll is the fallback).
			_, _ = pool.Exec(context.WithoutCancel(ctx), `SELECT pg_notify($1, '')`, db.OutboxChannel)
		}
		return p, nil
	}
	code := "error"
	var conflict *TopicConflictError
	switch {
	case errors.As(err, &conflict):
		code = "conflict"
		ev.Before = pauseJSON(conflict.Paused)
	case errors.Is(err, ErrInvalidAction):
		code = "invalid"
	}
	ev.Outcome, ev.ErrorCode = audit.OutcomeError, code
	actx := context.WithoutCancel(ctx)
	if aerr := db.WithTx(actx, pool, func(tx pgx.Tx) error { return audit.Record(actx, tx, ev) }); aerr != nil {
		return TopicPause{}, errors.Join(err, fmt.Errorf("outbox: audit the refused %s: %w", ev.Action, aerr))
	}
	return TopicPause{}, err
}

// pauseJSON is a pause as an audit row's before or after (null: none).
func pauseJSON(p *TopicPause) json.RawMessage {
	if p == nil || p.Topic == "" {
		return nil
	}
	b, _ := json.Marshal(p) // plain fields: Marshal cannot fail
	return b
}
