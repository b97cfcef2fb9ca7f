-- internal/inbox: where each shard of a sharded consumer has read up to.
--
-- A sharded consumer (inbox.ShardedConsumer, `console consume --shards N`)
-- reads each shard of the broker in order and commits a whole batch in one
-- transaction: inbox rows, effects and this row's new position together. A
-- restart, a crash or a second process taking the shard over resumes right
-- after the last committed batch, so nothing is skipped and nothing is
-- applied out of order; the position only moves forward from the value the
-- reader started from (compare-and-set), so two readers of one shard can
-- never both advance it. The shard count is part of the key: events
-- published under another count travel on other subjects.

-- +goose Up
CREATE TABLE inbox_shard_position (
    consumer   text        NOT NULL,
    shards     integer     NOT NULL CHECK (shards > 0),
    shard      integer     NOT NULL CHECK (shard >= 0 AND shard < shards),
    position   bigint      NOT NULL DEFAULT 0 CHECK (position >= 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, shards, shard)
);

-- +goose Down
DROP TABLE inbox_shard_position;
