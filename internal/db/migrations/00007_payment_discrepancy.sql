-- internal/payments: discrepancies between our final payment status and the
-- provider's evidence.
--
-- A payment recorded failed while a settlement file line or an inquiry says
-- the provider charged it (or completed while the provider says it failed)
-- is a machine's mistake that only a person may correct: no worker flips a
-- final payment, releases or re-takes money on its own. So the contradiction
-- is recorded here, durably and once per payment while it is open, with the
-- evidence that showed it (a settlement file's sha256 and line, or an
-- inquiry; the provider's reference; when), and it stays open until an
-- operator closes it (resolved_at, resolved_by, resolution: a later issue).
--
-- The reconcile worker also looks again, a bounded few times, at payments
-- that failed as "provider unavailable" (the provider said it did not
-- process them) to catch a charge that did happen; those checks are due by
-- payment.next_inquiry_at, hence the partial index on failed payments with a
-- check pending, so the worker reads O(due) rows, never the failed history.

-- +goose Up
CREATE TABLE payment_discrepancy (
    discrepancy_id   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operation_id     uuid        NOT NULL REFERENCES payment (operation_id),
    recorded_status  text        NOT NULL CHECK (recorded_status IN ('completed', 'failed')),
    provider_outcome text        NOT NULL CHECK (provider_outcome IN ('succeeded', 'failed')),
    source           text        NOT NULL CHECK (source IN ('settlement', 'inquiry')),
    evidence         text        NOT NULL, -- e.g. "settlement sha256:<hex> line 7" or "inquiry"
    provider_ref     text,
    detected_at      timestamptz NOT NULL,
    resolved_at      timestamptz,
    resolved_by      text,         -- the operator (iss|sub), never PII
    resolution       text,
    CONSTRAINT payment_discrepancy_resolved_together CHECK ((resolved_at IS NULL) = (resolved_by IS NULL))
);
-- At most one open discrepancy per payment: evidence seen again (the same
-- file applied twice, a second inquiry) adds nothing while one is open.
CREATE UNIQUE INDEX payment_discrepancy_open_op_idx ON payment_discrepancy (operation_id) WHERE resolved_at IS NULL;
-- Listing and counting open discrepancies costs O(open), never O(history).
CREATE INDEX payment_discrepancy_open_idx ON payment_discrepancy (detected_at, discrepancy_id) WHERE resolved_at IS NULL;
-- Failed payments with a pending re-check by inquiry.
CREATE INDEX payment_failed_check_idx ON payment (next_inquiry_at) WHERE status = 'failed' AND next_inquiry_at IS NOT NULL;

-- +goose Down
DROP INDEX payment_failed_check_idx;
DROP TABLE payment_discrepancy;
