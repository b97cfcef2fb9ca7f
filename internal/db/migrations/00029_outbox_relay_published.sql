-- What each relay has published, in its report (outbox_relay, migration
-- 00026): how many events since it started, and when it last marked one
-- published. A relay whose claim loop is stuck (a publish that never
-- returns, a connection that hangs) still reports, since reports run on
-- their own; it showed as running while publishing nothing. Now the relays
-- page shows each relay's last publish beside its state.
--
-- published_at is the database's clock: the relay sends how long ago its
-- last publish was, and the report subtracts it from the statement's time,
-- so hosts with skewed clocks agree.

-- +goose Up
ALTER TABLE outbox_relay
    ADD COLUMN published    bigint      NOT NULL DEFAULT 0,  -- events published and marked since it started
    ADD COLUMN published_at timestamptz;                     -- its last mark (NULL: none yet)

-- +goose Down
-- The schema is never rolled back by this tool.
SELECT 1;
