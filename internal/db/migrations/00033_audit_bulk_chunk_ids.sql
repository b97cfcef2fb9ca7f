-- internal/audit: an event's page lists the bulk jobs that changed it. A
-- bulk job writes one audit row per chunk (action outbox.bulk.chunk, target
-- the job), whose after names the chunk's events in "ids"; the event pages
-- read the chunks naming one event through this index, so a retry, discard
-- or replay made by a job shows on each event it changed, as a single
-- action's row does. Partial: only chunk rows enter it. Building it reads
-- audit_event once, in the migration's transaction, holding every audited
-- action (appends wait for the build) for as long: on a trail of millions
-- of rows, run `console migrate up` at a quiet time.

-- +goose Up
CREATE INDEX audit_event_bulk_ids_idx ON audit_event USING gin ((after -> 'ids') jsonb_path_ops)
    WHERE action = 'outbox.bulk.chunk';

-- +goose Down
-- Append-only history: the schema is never rolled back by this tool.
SELECT 1;
