-- The console's payments screens (issue 10):
-- * An inquiry's answer was not kept: the list shows, on every unknown row,
--   when the provider was last asked and what it said, so payment gets
--   last_inquiry_at and last_inquiry_answer (a provider outcome word or
--   no_answer), written by payments.(*Service).Inquire.
-- * The list is ordered by status then time and filtered by merchant or
--   invoice: (merchant_id, status, created_at DESC, operation_id) serves a
--   merchant's list in the list's own order, and invoice_id alone had no
--   index (payment_business_identity leads with merchant_id and skips failed
--   payments). The default view uses payment_unknown_idx and
--   payment_status_created_idx, which exist.
-- * Four eyes: above CONSOLE_FOUR_EYES_ABOVE an operator's resolve is a
--   request that a different operator approves (the resolve happens then) or
--   rejects. At most one pending request per payment.
-- * Settlement files uploaded to the console are kept until they are applied
--   (or for a short while), keyed by their sha256, so the confirmation
--   applies exactly the bytes whose dry run the operator saw.

-- +goose Up
ALTER TABLE payment
    ADD COLUMN last_inquiry_at     timestamptz,
    ADD COLUMN last_inquiry_answer text;

CREATE INDEX payment_merchant_status_created_idx ON payment (merchant_id, status, created_at DESC, operation_id);
CREATE INDEX payment_invoice_idx ON payment (invoice_id);

CREATE TABLE payment_approval (
    id           bigserial   PRIMARY KEY,
    operation_id uuid        NOT NULL REFERENCES payment (operation_id),
    outcome      text        NOT NULL CHECK (outcome IN ('succeeded', 'failed')),
    reason       text        NOT NULL CHECK (reason <> ''),
    evidence     text        NOT NULL CHECK (evidence <> ''),
    requested_by text        NOT NULL, -- iss|sub of the requester
    requester_name text      NOT NULL DEFAULT '',
    requested_at timestamptz NOT NULL DEFAULT now(),
    state        text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'approved', 'rejected')),
    decided_by   text,                 -- iss|sub of the second operator
    decider_name text,
    decided_at   timestamptz,
    CONSTRAINT payment_approval_decided_together CHECK ((state = 'pending') = (decided_by IS NULL AND decided_at IS NULL)),
    CONSTRAINT payment_approval_four_eyes CHECK (decided_by IS NULL OR decided_by <> requested_by)
);
CREATE UNIQUE INDEX payment_approval_pending_op_idx ON payment_approval (operation_id) WHERE state = 'pending';
CREATE INDEX payment_approval_op_idx ON payment_approval (operation_id, id);
CREATE INDEX payment_approval_pending_idx ON payment_approval (requested_at, id) WHERE state = 'pending';

CREATE TABLE payment_settlement_upload (
    sha256      text        PRIMARY KEY CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    body        bytea       NOT NULL,
    uploaded_by text        NOT NULL,
    uploaded_at timestamptz NOT NULL DEFAULT now(),
    applied_at  timestamptz
);

-- +goose Down
DROP TABLE payment_settlement_upload;
DROP TABLE payment_approval;
DROP INDEX payment_invoice_idx;
DROP INDEX payment_merchant_status_created_idx;
ALTER TABLE payment DROP COLUMN last_inquiry_answer, DROP COLUMN last_inquiry_at;
