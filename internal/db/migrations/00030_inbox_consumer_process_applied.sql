-- What each consumer process has applied, in its report
-- (inbox_consumer_process, migration 00028): how many events since it
-- started, and when it last applied one. The inbox page's counters are per
-- consumer name; with several processes under one name, a process that
-- runs its shards but applies nothing (a stuck effect, a hung broker read)
-- was hidden by the others.
--
-- applied_at is the database's clock: the process sends how long ago its
-- last apply was, and the report subtracts it from the statement's time.

-- +goose Up
ALTER TABLE inbox_consumer_process
    ADD COLUMN applied    bigint      NOT NULL DEFAULT 0,  -- events applied since it started
    ADD COLUMN applied_at timestamptz;                     -- its last apply (NULL: none yet)

-- +goose Down
-- The schema is never rolled back by this tool.
SELECT 1;
