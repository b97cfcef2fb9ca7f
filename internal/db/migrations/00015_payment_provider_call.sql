-- internal/payments: every call to the provider about a payment (charge or
-- inquiry), with its answer and latency, so on-call sees on the payment's
-- page what the provider was asked and said. One or two rows per payment,
-- kept as long as the payment.

-- +goose Up
CREATE TABLE payment_provider_call (
    call_id      bigserial   PRIMARY KEY,
    operation_id uuid        NOT NULL,
    op           text        NOT NULL CHECK (op IN ('charge', 'inquire')),
    started_at   timestamptz NOT NULL,
    duration_us  bigint      NOT NULL CHECK (duration_us >= 0),
    answer       text,       -- the provider's outcome word; NULL when it did not answer
    error        text        -- why there was no answer (never customer data)
);
CREATE INDEX payment_provider_call_op_idx ON payment_provider_call (operation_id, call_id);

-- +goose Down
DROP TABLE payment_provider_call;
