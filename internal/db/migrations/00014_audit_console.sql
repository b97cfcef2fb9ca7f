-- internal/audit, for the console's audit pages (issue 10, items 7-9).
--
-- Filters of GET /audit that the existing indexes do not serve:
--   * the actor filter takes a subject or a display name, without the issuer
--     (audit_event_actor_idx leads with actor_iss), so each gets its own
--     (column, seq DESC) index: an OR of the two is a BitmapOr of two probes;
--   * the time range is turned into a range of seq (appends are serialized,
--     so seq order is occurred_at order) with one probe of an occurred_at
--     index at each end, then pages walk the primary key.
-- Action and target already have (action, seq DESC) and
-- (target_type, target_id, seq DESC); outcome has three values and is a
-- filter on whichever scan the other fields choose.
--
-- audit_verification: one row per chain verification started from the
-- console (POST /audit/verify), so the audit pages can say whether the chain
-- was intact when it was last checked, and a running check shows progress.
-- Small: one row per click.

-- +goose Up
CREATE INDEX audit_event_actor_sub_idx ON audit_event (actor_sub, seq DESC);
CREATE INDEX audit_event_actor_name_idx ON audit_event (actor_name, seq DESC);
CREATE INDEX audit_event_occurred_idx ON audit_event (occurred_at);

CREATE TABLE audit_verification (
    id               bigserial   PRIMARY KEY,
    requested_by     text        NOT NULL,              -- display name or subject of who asked
    started_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    heartbeat_at     timestamptz NOT NULL DEFAULT clock_timestamp(), -- a running check that stops beating was abandoned
    finished_at      timestamptz,
    state            text        NOT NULL DEFAULT 'running'
                     CHECK (state IN ('running', 'intact', 'broken', 'failed')),
    checked          bigint      NOT NULL DEFAULT 0 CHECK (checked >= 0),
    head_seq         bigint,                            -- the last row checked (of an intact chain: its head)
    first_broken_seq bigint,
    problem          text        NOT NULL DEFAULT '',
    CHECK ((state = 'running') = (finished_at IS NULL)),
    CHECK ((state = 'broken') = (first_broken_seq IS NOT NULL))
);
-- At most one verification runs at a time.
CREATE UNIQUE INDEX audit_verification_running_idx ON audit_verification ((true)) WHERE state = 'running';

-- +goose Down
DROP TABLE audit_verification;
DROP INDEX audit_event_occurred_idx;
DROP INDEX audit_event_actor_name_idx;
DROP INDEX audit_event_actor_sub_idx;
