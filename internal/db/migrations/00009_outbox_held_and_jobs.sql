-- internal/outbox: a dead letter holds its aggregate, operators may discard,
-- and bulk actions run as durable jobs (issue 9).
--
-- With ordering on, a dead event now holds back the later events of its
-- aggregate exactly as a pending one does (DESIGN invariant 4): publishing
-- seq 3 while seq 2 is dead would deliver the aggregate out of order, and a
-- consumer that drops stale versions would then drop seq 2 for ever once an
-- operator retries it. So the claim's "is an earlier event of this aggregate
-- unfinished?" probe must see dead rows too: the partial index it probes is
-- rebuilt over pending and dead rows. Its name is kept (plans, benchmarks
-- and dashboards name it); read "pending" as "not finished".
--
-- discarded is an operator's decision never to publish an event (reason
-- required, audited by the console); it is terminal and releases the
-- aggregate. It has its own columns rather than reusing dead_reason, because
-- a discarded event keeps the history of why it died (dead_at, dead_reason,
-- last_error) beside why it was given up.
--
-- The console's list filters by status, topic, event type, aggregate, id
-- prefix and time, always in id order (UUIDv7: creation order) with keyset
-- pages. Pending rows have outbox_event_pending_idx (id); dead and discarded
-- rows get their own small id-ordered partial indexes; topic and event type
-- need (x, id) over the whole table, or a page of a rare topic would walk
-- the primary key through millions of other rows. Those two are the only
-- indexes over all of history this migration adds: each costs every insert
-- and every publish one more index entry, which is the price of browsing
-- tens of millions of rows by topic or type in milliseconds. Aggregates use
-- the existing unique (aggregate_type, aggregate_id, aggregate_seq) index;
-- time ranges and id prefixes are id ranges on the primary key.
--
-- outbox_job holds a bulk action (retry, dead-letter or discard everything
-- matching a filter) so it survives a console restart: a runner claims it
-- under a lease (locked_until, lock_token, as the relay claims events), walks
-- the matching rows in id order in chunks, one transaction per chunk, and
-- records its cursor in the same transaction, so a crash resumes at the next
-- chunk with no row done twice and none skipped.
--
-- Index builds here are not CONCURRENTLY (migrations run in one
-- transaction each): on a large outbox, run this migration in a quiet hour;
-- inserts wait while the two whole-table indexes build.

-- +goose Up
ALTER TABLE outbox_event DROP CONSTRAINT outbox_event_status_check;
ALTER TABLE outbox_event ADD CONSTRAINT outbox_event_status_check
    CHECK (status IN ('pending', 'published', 'dead', 'discarded'));
ALTER TABLE outbox_event
    ADD COLUMN discarded_at   timestamptz,
    ADD COLUMN discard_reason text;

DROP INDEX outbox_event_pending_aggregate_idx;
CREATE INDEX outbox_event_pending_aggregate_idx
    ON outbox_event (aggregate_type, aggregate_id, aggregate_seq) WHERE status IN ('pending', 'dead');

-- The console's list pages and bulk jobs walk dead rows in id order
-- (outbox_event_dead_idx is in dead_at order, for the dashboard).
CREATE INDEX outbox_event_dead_id_idx ON outbox_event (id) WHERE status = 'dead';
-- Few rows; listed in id order and pruned past retention.
CREATE INDEX outbox_event_discarded_idx ON outbox_event (id) WHERE status = 'discarded';
CREATE INDEX outbox_event_topic_idx ON outbox_event (topic, id);
CREATE INDEX outbox_event_type_idx ON outbox_event (event_type, id);

CREATE TABLE outbox_job (
    id                  uuid        PRIMARY KEY,          -- UUIDv7 made by the app
    kind                text        NOT NULL CHECK (kind IN ('retry', 'dead_letter', 'discard')),
    filter              jsonb       NOT NULL,             -- outbox.Filter as JSON
    reason              text        NOT NULL DEFAULT '',
    requested_by        text        NOT NULL,             -- the console's actor identity
    state               text        NOT NULL DEFAULT 'pending'
                        CHECK (state IN ('pending', 'running', 'done', 'cancelled', 'failed')),
    chunk_size          integer     NOT NULL CHECK (chunk_size BETWEEN 1 AND 5000),
    matched             bigint      NOT NULL DEFAULT 0,   -- rows matching when the job was created
    done                bigint      NOT NULL DEFAULT 0,   -- rows changed
    skipped             bigint      NOT NULL DEFAULT 0,   -- rows matched but no longer in the expected state
    upto_id             uuid,                             -- highest matching id at creation: the walk ends there
    cursor_id           uuid,                             -- last id walked: the next chunk starts after it
    locked_until        timestamptz,
    lock_token          uuid,
    failures            integer     NOT NULL DEFAULT 0,   -- chunks failed in a row; the job fails after a few
    cancel_requested_at timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    started_at          timestamptz,
    finished_at         timestamptz,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    last_error          text
);
-- Runners look only at unfinished jobs.
CREATE INDEX outbox_job_runnable_idx ON outbox_job (id) WHERE state IN ('pending', 'running');

-- +goose Down
-- Append-only history: the schema is never rolled back by this tool.
SELECT 1;
