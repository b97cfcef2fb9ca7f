-- Each running relay keeps one row here (outbox.Relay, report.go), so the
-- console can say whether relays run at all and whether they pause on a
-- broker outage. Until now that lived only in each relay process's
-- /metrics (sluice_outbox_relays_broker_unavailable), which the dashboard
-- cannot see: a growing backlog looked the same whether the relays were
-- paused, dead or merely behind.
--
-- A relay writes its row when it starts, every report interval (5 s by
-- default) and when it pauses or resumes, and deletes it when it stops. A
-- relay that stops without deleting it (killed, its host lost, cut off from
-- the database) leaves a row whose expires_at passes: the console shows it
-- as silent, and relays remove rows silent for an hour. A few rows, one
-- update every few seconds each: fillfactor leaves room for HOT updates.

-- +goose Up
CREATE TABLE outbox_relay (
    id                uuid        PRIMARY KEY,      -- made by the relay when it starts
    name              text        NOT NULL,         -- RelayConfig.Name
    host              text        NOT NULL,
    pid               integer     NOT NULL,
    started_at        timestamptz NOT NULL,
    seen_at           timestamptz NOT NULL,         -- its last report (database clock)
    expires_at        timestamptz NOT NULL,         -- silent from then on: seen_at + 3 report intervals
    unavailable_since timestamptz,                  -- paused on a broker outage since (NULL: not paused)
    -- How it publishes: relays that disagree on these break what consumers
    -- rely on (a sharded consumer never reads an unsharded subject; ordering
    -- off lets an aggregate's events overtake each other), so the console
    -- flags it.
    shards            integer     NOT NULL,         -- OUTBOX_SHARDS (0: unsharded)
    ordered           boolean     NOT NULL          -- RELAY_ORDERING
) WITH (fillfactor = 50);

-- +goose Down
-- The schema is never rolled back by this tool.
SELECT 1;
