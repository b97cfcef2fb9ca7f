-- Each running consumer process keeps one row here (inbox.Consumer and
-- inbox.ShardedConsumer, presence.go), as relays do in outbox_relay, so the
-- console's inbox page can say which consumers run, on how many shards, and
-- which shards nobody reads. Until now a consumer was only its counters: a
-- consumer started with another OUTBOX_SHARDS than the relays (it reads
-- subjects nobody publishes on) or a shard set that no running process owns
-- (CONSUME_SHARDS_OWNED split over processes, one of them gone) looked like
-- a consumer with nothing to do.
--
-- A process writes its row when it starts, every report interval (5 s by
-- default) and when it takes or loses a shard, and deletes it when it stops.
-- One that stops without deleting it (killed, its host lost, cut off from
-- the database) leaves a row whose expires_at passes: the page shows it as
-- silent, and reports remove rows silent for an hour.

-- +goose Up
CREATE TABLE inbox_consumer_process (
    id         uuid        PRIMARY KEY,      -- made by the process when it starts
    consumer   text        NOT NULL,         -- the inbox consumer name it applies for
    host       text        NOT NULL,
    pid        integer     NOT NULL,
    started_at timestamptz NOT NULL,
    seen_at    timestamptz NOT NULL,         -- its last report (database clock)
    expires_at timestamptz NOT NULL,         -- silent from then on: seen_at + 3 report intervals
    shards     integer     NOT NULL CHECK (shards >= 0),  -- the OUTBOX_SHARDS it reads (0: unsharded)
    owned      integer[],                    -- the shards it may read (NULL: every one)
    held       integer[]   NOT NULL DEFAULT '{}'          -- the shards it reads now (sharded only)
) WITH (fillfactor = 50);

-- +goose Down
-- The schema is never rolled back by this tool.
SELECT 1;
