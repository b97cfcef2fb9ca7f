-- internal/payments and internal/pii: search payments by tax id without
-- storing it in clear.
--
-- customer_tax_id_bidx is the tax id's blind index (HMAC under
-- PII_BLIND_INDEX_KEY of the normalised value: no spaces, dashes or dots),
-- written beside customer_email_bidx when a payment is created; rows
-- created before this migration get it from `console pii rotate`, which
-- fills a missing index while it rewrites the customer envelopes.
--
-- Both indexes are partial (most rows of a bulk load may lack a tax id) and
-- end with operation_id, so a search walks one customer's payments in
-- keyset order (WHERE bidx = $1 AND operation_id > $2 ORDER BY operation_id)
-- without sorting: the email index is rebuilt with that second column.

-- +goose Up
ALTER TABLE payment ADD COLUMN customer_tax_id_bidx bytea; -- blind index: HMAC, never the clear value
CREATE INDEX payment_customer_tax_id_bidx_idx ON payment (customer_tax_id_bidx, operation_id)
    WHERE customer_tax_id_bidx IS NOT NULL;
DROP INDEX payment_customer_email_bidx_idx;
CREATE INDEX payment_customer_email_bidx_idx ON payment (customer_email_bidx, operation_id)
    WHERE customer_email_bidx IS NOT NULL;

-- +goose Down
DROP INDEX payment_customer_email_bidx_idx;
CREATE INDEX payment_customer_email_bidx_idx ON payment (customer_email_bidx)
    WHERE customer_email_bidx IS NOT NULL;
DROP INDEX payment_customer_tax_id_bidx_idx;
ALTER TABLE payment DROP COLUMN customer_tax_id_bidx;
