-- internal/outbox: an operator can pause a topic and replay published events
-- (issue 13).
--
-- outbox_topic_pause holds the paused topics, one row each with who paused
-- it, when and why, so a pause survives relay and console restarts. Relays
-- read it (a handful of rows) once per claim and skip those topics; events
-- keep accumulating as pending. Resume deletes the row; the audit trail
-- keeps the history.
--
-- outbox_event_pending_topic_idx answers "the lowest pending id of each
-- topic" with a few index probes per topic: while a topic is paused, its
-- backlog may sit at the head of outbox_event_pending_idx, and the claim
-- starts its walk at the lowest pending id of a topic that is not paused
-- instead of reading through the paused backlog on every batch. Pending rows
-- only: the index costs one entry per event while it is pending, and a
-- claim (which changes no indexed column) stays a HOT update.
--
-- A replay makes published events pending again so the relays publish them
-- once more with their original ids (the relay stays the only publisher):
-- replay_to names the one consumer the replay is for (NULL: everyone on the
-- topic), replay_count says how many times an operator asked for the event
-- again (the broker adapters make each replay a new broker message, so
-- JetStream's duplicate window does not drop it), replayed_at when the last
-- replay was asked for; published_at is the last publish. The relay clears
-- replay_to when it marks the event published again. Nullable columns and a
-- constant default: adding them rewrites nothing.

-- +goose Up
CREATE TABLE outbox_topic_pause (
    topic     text        PRIMARY KEY CHECK (length(topic) BETWEEN 1 AND 200),
    paused_by text        NOT NULL,             -- the actor, as the console or CLI names it in the audit trail
    paused_at timestamptz NOT NULL DEFAULT now(),
    reason    text        NOT NULL CHECK (reason <> '')
);

-- "topic > ''" holds for every row (a topic is 1 to 200 characters) but no
-- claim states it, so the claim can never take this index: when the
-- statistics still say nothing is pending (a backlog that grew faster than
-- autoanalyze), the planner may read a partial index of pending rows whole
-- and sort it on each claim instead of walking outbox_event_pending_idx in
-- order (bench/README.md, R2). Only the floor read, which states it, uses
-- this index.
CREATE INDEX outbox_event_pending_topic_idx ON outbox_event (topic, id) WHERE status = 'pending' AND topic > '';

ALTER TABLE outbox_event
    ADD COLUMN replay_to    text,
    ADD COLUMN replay_count integer NOT NULL DEFAULT 0,
    ADD COLUMN replayed_at  timestamptz;

ALTER TABLE outbox_job DROP CONSTRAINT outbox_job_kind_check;
ALTER TABLE outbox_job ADD CONSTRAINT outbox_job_kind_check
    CHECK (kind IN ('retry', 'dead_letter', 'discard', 'replay'));
-- The consumer a replay job is for (NULL: every consumer of the topics).
ALTER TABLE outbox_job ADD COLUMN replay_to text;

-- +goose Down
-- Append-only history: the schema is never rolled back by this tool.
SELECT 1;
