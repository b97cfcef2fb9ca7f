-- internal/outbox: exact backlog counts kept on write, so the console's
-- snapshot reads the pending and dead counts per topic in O(topics) instead
-- of counting every pending row on every tick (bench/README.md, D1: ~30 ms at
-- 100k pending).
--
-- outbox_backlog_count holds insert-only DELTA rows: +k or -k events of a
-- topic in a status ('pending' or 'dead'; published events are history and
-- are not counted). The count of (topic, status) is sum(n) over its rows.
-- There is no unique key and no row is ever updated, so concurrent writers
-- never wait for each other on a counter row: each statement adds its own
-- rows. outbox.CompactBacklogCounts collapses them into one row per
-- (topic, status) (the relay and the console call it on a timer);
-- outbox.RecountBacklog replaces them with an exact recount (repair,
-- `console outbox recount`, the bench after a bulk preload with the
-- triggers disabled).
--
-- Statement-level AFTER triggers with transition tables keep the deltas true
-- for every INSERT and DELETE, including SQL the product does not run
-- (producers in other languages inserting directly, scripts, tests, the
-- pruner): one delta row per (topic, status) a statement added or removed,
-- none when it touched no pending or dead event. TRUNCATE empties the counts.
--
-- UPDATEs have no trigger. An UPDATE trigger with transition tables stores
-- the old and new version of every updated row, and the relay's claim (an
-- UPDATE of up to 100 rows that never changes status) paid for it on every
-- batch: with ~50k pending ~1 KB events, batches of 100, the trigger alone
-- took 0.15 ms per claim and 0.27-0.40 ms per claim+mark, 8-9% of their
-- 3.4-4.2 ms (bench/README.md, "The dashboard snapshot"). Instead every
-- product statement that changes an event's status (internal/outbox: the
-- relay's mark and failure, the operator actions, bulk jobs and replays)
-- writes its own delta in the same statement (outbox.countedUpdate). Nothing
-- else may change outbox_event.status (or topic, which the product never
-- changes) by hand; whoever does runs `console outbox recount` after
-- (outbox.RecountBacklog).
--
-- The trigger functions are SECURITY DEFINER (run as the tables' owner, with
-- the search_path of this migration): a producer's role that may insert into
-- outbox_event needs no grant on the count table.

-- +goose Up
CREATE TABLE outbox_backlog_count (
    topic  text   NOT NULL,
    status text   NOT NULL CHECK (status IN ('pending', 'dead')),
    n      bigint NOT NULL
);

-- +goose StatementBegin
CREATE FUNCTION outbox_backlog_count_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO outbox_backlog_count (topic, status, n)
    SELECT topic, status, count(*) FROM outbox_new
     WHERE status IN ('pending', 'dead')
     GROUP BY topic, status;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox_backlog_count_delete() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO outbox_backlog_count (topic, status, n)
    SELECT topic, status, -count(*) FROM outbox_old
     WHERE status IN ('pending', 'dead')
     GROUP BY topic, status;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- TRUNCATE holds ACCESS EXCLUSIVE on outbox_event, so no writer adds deltas
-- meanwhile; the advisory lock (the one outbox.RecountBacklog takes, and that
-- a compaction must get, shared, before it starts) keeps a compaction from
-- re-inserting collapsed counts this DELETE cannot see. 348377517063 is
-- outbox.backlogCountLock.
-- +goose StatementBegin
CREATE FUNCTION outbox_backlog_count_truncate() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(348377517063);
    DELETE FROM outbox_backlog_count;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_backlog_count_insert AFTER INSERT ON outbox_event
    REFERENCING NEW TABLE AS outbox_new
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_backlog_count_insert();
CREATE TRIGGER outbox_backlog_count_delete AFTER DELETE ON outbox_event
    REFERENCING OLD TABLE AS outbox_old
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_backlog_count_delete();
CREATE TRIGGER outbox_backlog_count_truncate AFTER TRUNCATE ON outbox_event
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_backlog_count_truncate();

-- The seed is exact: CREATE TRIGGER took SHARE ROW EXCLUSIVE on outbox_event
-- above, which conflicts with the ROW EXCLUSIVE lock every INSERT, UPDATE and
-- DELETE takes (PostgreSQL's table-level lock conflict table), so it waited
-- for the writers in progress to commit and keeps new ones out until this
-- migration commits (goose runs it in one transaction). This statement's
-- snapshot, taken after the lock (READ COMMITTED: one per statement), sees
-- every committed event and nothing can change them before the triggers are
-- live.
INSERT INTO outbox_backlog_count (topic, status, n)
SELECT topic, status, count(*) FROM outbox_event
 WHERE status IN ('pending', 'dead')
 GROUP BY topic, status;

-- +goose Down
-- Append-only history: the schema is never rolled back by this tool.
SELECT 1;
