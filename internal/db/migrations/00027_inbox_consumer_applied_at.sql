-- When each consumer last applied an effect, for the console's inbox page: a
-- consumer that stopped (killed, stuck on a failing effect, cut off from the
-- broker) showed only as a flat line in its sparkline, while the outbox
-- looked healthy, since the relays go on publishing without it.
--
-- The column rides on the counter row every apply already updates in its
-- transaction (inbox.Handle, HandleBatch): no statement more, and no index,
-- so the update stays HOT. NULL until the row's next apply.

-- +goose Up
ALTER TABLE inbox_consumer_shard ADD COLUMN applied_at timestamptz;

-- +goose Down
-- The schema is never rolled back by this tool.
SELECT 1;
