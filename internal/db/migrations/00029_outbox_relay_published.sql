-- What each relay has done, in its report (outbox_relay, migration 00026):
-- how many events it published since it started and when it last marked
-- one published; how many publish attempts failed and the last failure's
-- error (the broker's words, as stored in outbox_event.last_error). A relay
-- whose claim loop is stuck (a publish that never returns, a connection that
-- hangs) still reports, since reports run on their own; it showed as running
-- while publishing nothing. Now the relays page shows each relay's last
-- publish and last failure beside its state.
--
-- The times are the database's clock: the relay sends how long ago each
-- was, and the report subtracts it from the statement's time, so hosts with
-- skewed clocks agree.

-- +goose Up
ALTER TABLE outbox_relay
    ADD COLUMN published     bigint      NOT NULL DEFAULT 0,  -- events published and marked since it started
    ADD COLUMN published_at  timestamptz,                     -- its last mark (NULL: none yet)
    ADD COLUMN failed        bigint      NOT NULL DEFAULT 0,  -- publish attempts that failed since it started
    ADD COLUMN last_error    text,                            -- the last one's error (NULL: none yet)
    ADD COLUMN last_error_at timestamptz;                     -- and when

-- +goose Down
-- The schema is never rolled back by this tool.
SELECT 1;
