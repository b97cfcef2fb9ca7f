-- What each consumer process has done, in its report
-- (inbox_consumer_process, migration 00028): how many events it applied
-- since it started and when it last applied one; how many times a message
-- or batch failed (its effect or its read) and when it last did. The inbox
-- page's counters are per consumer name; with several processes under one
-- name, a process that runs its shards but applies nothing (an effect that
-- keeps failing, a hung broker read) was hidden by the others. No error
-- text: an effect's error may quote what it applies, customers' data
-- included; the process's log has it.
--
-- The times are the database's clock: the process sends how long ago each
-- was, and the report subtracts it from the statement's time.

-- +goose Up
ALTER TABLE inbox_consumer_process
    ADD COLUMN applied    bigint      NOT NULL DEFAULT 0,  -- events applied since it started
    ADD COLUMN applied_at timestamptz,                     -- its last apply (NULL: none yet)
    ADD COLUMN failed     bigint      NOT NULL DEFAULT 0,  -- messages or batches that failed since it started
    ADD COLUMN failed_at  timestamptz;                     -- the last failure (NULL: none yet)

-- +goose Down
-- The schema is never rolled back by this tool.
SELECT 1;
