-- internal/inbox: counters without a hot row, and the reference consumer's
-- effect table.
--
-- Counting every applied message on inbox_consumer.processed made all
-- messages of one consumer queue up on that single row (its lock is held
-- until each effect's transaction commits). Processed counts now go to one of
-- a few shard rows per consumer, picked from the message id, so concurrent
-- handlers rarely meet; readers sum the shards. Duplicates and stale drops
-- are rare and stay on inbox_consumer.

-- +goose Up
CREATE TABLE inbox_consumer_shard (
    consumer  text     NOT NULL,
    shard     smallint NOT NULL CHECK (shard >= 0),
    processed bigint   NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer, shard)
);

-- What `console consume` does with each event: one row per applied event.
-- Deliberately no unique key on event_id, so an effect applied twice would
-- show as two rows instead of being hidden by a constraint: tests and the
-- demo count rows per event id to prove "effect once".
CREATE TABLE consume_effect (
    effect_id      bigserial   PRIMARY KEY,
    consumer       text        NOT NULL,
    event_id       text        NOT NULL,
    topic          text        NOT NULL,
    event_type     text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    aggregate_seq  bigint      NOT NULL,
    applied_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX consume_effect_event_idx ON consume_effect (consumer, event_id);

-- +goose Down
DROP TABLE consume_effect;
DROP TABLE inbox_consumer_shard;
