-- The held count (outbox.HeldRead: pending events behind a dead letter of
-- their aggregate) runs in every dashboard snapshot, so on every feed tick and
-- /metrics scrape. It starts from the first dead event of each aggregate.
-- From outbox_event_dead_id_idx (id order) that was a heap visit for every
-- dead row and a sort on each tick: with 1,000 dead events, 1,005 buffers and
-- a sort, most of the snapshot's time (bench D1). This index is in aggregate
-- order, so DISTINCT ON walks it and neither sorts nor, on all-visible pages,
-- reads the heap. Only dead rows enter it, and none of the claim's columns is
-- in it, so the claim stays a HOT update.
--
-- Not CONCURRENTLY (migrations run in one transaction each): the build scans
-- the whole table while inserts wait; on a large outbox, run it in a quiet
-- hour.

-- +goose Up
CREATE INDEX outbox_event_dead_aggregate_idx
    ON outbox_event (aggregate_type, aggregate_id, aggregate_seq) WHERE status = 'dead';

-- +goose Down
-- The schema is never rolled back by this tool.
SELECT 1;
