-- internal/payments: merchants authenticate with API keys, accounts have an
-- owner, and an invoice may be tried again after a definite failure.
--
-- Why (issue 7, docs/decisions.md):
-- * X-Merchant-ID was taken on trust, so anyone could pay from any account
--   and read any merchant's payments. A merchant now proves who it is with
--   an API key (stored as a SHA-256 hash only; several per merchant so keys
--   rotate), and a payment may only debit an account the merchant owns.
--   Accounts that exist before this migration have no owner: nobody can pay
--   from them through the API until an operator assigns them
--   (`console merchants assign`), which is the safe default.
-- * UNIQUE (merchant_id, invoice_id, payment_type) counted failed payments,
--   so a decline or a two-second provider outage blocked the invoice for
--   ever. The business identity now allows at most one payment per invoice
--   that is not definitely failed (processing, unknown and completed all
--   block it), and numbers the attempts. Existing payments become attempt 1;
--   the old constraint guaranteed one payment per invoice, so both new
--   unique indexes hold on existing data.

-- +goose Up
CREATE TABLE merchant (
    merchant_id text        PRIMARY KEY
                CHECK (merchant_id ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    name        text        NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- An API key is "slk_<key_id>_<secret>"; only its SHA-256 is kept. key_id is
-- public (listed, logged, revoked by); the secret is shown once at creation.
CREATE TABLE merchant_api_key (
    key_id      text        PRIMARY KEY CHECK (key_id ~ '^[0-9a-f]{16}$'),
    merchant_id text        NOT NULL REFERENCES merchant (merchant_id),
    key_hash    bytea       NOT NULL CHECK (length(key_hash) = 32),
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX merchant_api_key_merchant_idx ON merchant_api_key (merchant_id, created_at);

ALTER TABLE account ADD COLUMN merchant_id text REFERENCES merchant (merchant_id);
CREATE INDEX account_merchant_idx ON account (merchant_id) WHERE merchant_id IS NOT NULL;

ALTER TABLE payment ADD COLUMN attempt integer NOT NULL DEFAULT 1 CHECK (attempt >= 1);
ALTER TABLE payment DROP CONSTRAINT payment_business_identity;
-- Attempts of one invoice are numbered 1, 2, … (two new keys racing for the
-- same next attempt: one wins, the other is refused).
ALTER TABLE payment ADD CONSTRAINT payment_business_attempt
    UNIQUE (merchant_id, invoice_id, payment_type, attempt);
-- The second line of defence against clients that mint a new key per retry:
-- at most one attempt per invoice that is not definitely failed.
CREATE UNIQUE INDEX payment_business_identity
    ON payment (merchant_id, invoice_id, payment_type) WHERE status <> 'failed';

-- +goose Down
-- Append-only history: the schema is never rolled back by this tool.
SELECT 1;
