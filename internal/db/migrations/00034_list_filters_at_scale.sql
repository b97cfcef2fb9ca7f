-- The console's lists, counts and dry runs on a large history (a review
-- with 5 M outbox events, 1 M payments and 1 M audit rows).
--
-- audit_event_outcome_idx: the audit list's outcome filter (denied or
-- error, a few percent of the trail) had no index, so its count read the
-- trail (141 ms at 1 M rows) and with an actor or an action that never
-- errs, so did the page (250-500 ms). Only rows whose outcome is not ok
-- enter it (ok is most of the trail and found at once along the primary
-- key), in the list's order. Audit rows are appended one per operator
-- action: the index costs them little. Building it reads audit_event once
-- in the migration's transaction, while appends wait.
--
-- outbox_event_kind_stats: the planner took topic, event_type and
-- aggregate_type for independent, when an event type belongs to one topic
-- and one aggregate type. A topic and an event type that never occur
-- together were then estimated at thousands of rows, and the list walked
-- the primary key back over the whole table to find none (2 s at 5 M
-- rows); a type and its own topic were estimated at a fraction of their
-- rows. The combinations' frequencies (a multi-column MCV list) let it
-- read such a filter from the type and topic indexes instead. Statistics
-- cost nothing on writes (ANALYZE computes them from its sample), where
-- another index on outbox_event would cost every insert and every relay
-- mark. ANALYZE here fills them at once (a sample: seconds, whatever the
-- size of the table); an empty outbox is left unanalyzed, as a new
-- database's is, so the planner keeps its floor for a table never analyzed
-- (autoanalyze computes them once it has rows).
--
-- outbox_job.matched_more_than: a dry run and the job it confirms count
-- the matching events up to a cap (outbox.JobCountExactBelow) instead of
-- all of them (a replay of one topic counted every published event it ever
-- had: 0.3-1.4 s at 5 M rows, twice). When the count stops at the cap,
-- matched_more_than records it and matched holds the planner's estimate;
-- NULL: matched is exact. Nullable, no default: adding it rewrites nothing.

-- +goose Up
CREATE INDEX audit_event_outcome_idx ON audit_event (outcome, seq DESC) WHERE outcome <> 'ok';

CREATE STATISTICS outbox_event_kind_stats (mcv) ON topic, event_type, aggregate_type FROM outbox_event;
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM outbox_event) THEN
        ANALYZE outbox_event;
    END IF;
END $$;
-- +goose StatementEnd

ALTER TABLE outbox_job ADD COLUMN matched_more_than bigint CHECK (matched_more_than > 0);

-- +goose Down
-- Append-only history: the schema is never rolled back by this tool.
SELECT 1;
