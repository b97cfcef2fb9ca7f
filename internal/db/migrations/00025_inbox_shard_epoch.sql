-- internal/inbox: the epoch a shard's position counts in.
--
-- A sharded consumer's position is a broker sequence: on NATS JetStream the
-- stream sequence. A stream deleted and created again (an operator's
-- mistake, or the publisher creating it again after finding it gone)
-- counts from 1 again, so a stored position N would skip the new stream's
-- first N messages. epoch names the sequence the position counts in (the
-- stream's creation time); a reader whose stored epoch is not the stream's
-- starts at the stream's first message. '' is a position stored before this
-- column existed, or a broker without positions (RabbitMQ).

-- +goose Up
ALTER TABLE inbox_shard_position ADD COLUMN epoch text NOT NULL DEFAULT '';

-- +goose Down
-- The schema is never rolled back by this tool.
SELECT 1;
