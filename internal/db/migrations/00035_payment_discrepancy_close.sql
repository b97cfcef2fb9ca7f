-- internal/payments: an operator closes a discrepancy (00007) from the
-- console, saying what was done about it outside the system (a refund
-- issued, the provider corrected its file). Closing changes nothing but
-- the discrepancy's row: never the payment, its reservation or the ledger.
--
-- resolved_by keeps the operator's id (iss|sub, never PII), as it did;
-- resolver_name is the name the pages show beside it (as payment_approval
-- keeps decider_name), and resolution the reason, now required of every
-- close (NOT VALID: a row closed by hand before this migration, without a
-- reason, is not checked, every later close is).
--
-- Two indexes: the closed list, newest close first, costs O(page), never
-- O(history); and a payment's discrepancies, open or closed, are found by
-- its id (the page's history, and a settlement file applied again not
-- re-opening a discrepancy that an operator closed on that same line).

-- +goose Up
ALTER TABLE payment_discrepancy ADD COLUMN resolver_name text;
ALTER TABLE payment_discrepancy ADD CONSTRAINT payment_discrepancy_resolution_given
    CHECK (resolved_at IS NULL OR length(btrim(coalesce(resolution, ''))) > 0) NOT VALID;
CREATE INDEX payment_discrepancy_closed_idx ON payment_discrepancy (resolved_at DESC, discrepancy_id DESC) WHERE resolved_at IS NOT NULL;
CREATE INDEX payment_discrepancy_op_idx ON payment_discrepancy (operation_id, discrepancy_id DESC);

-- +goose Down
-- Append-only history: the schema is never rolled back by this tool.
SELECT 1;
