-- The whole data model of DESIGN.md in one step, so later migrations only add
-- columns and indexes. Each table is owned by one package (named beside it),
-- which is the only place that writes SQL against it.

-- +goose Up

-- internal/outbox ----------------------------------------------------------
-- Written in the caller's transaction; the relay claims pending rows with
-- FOR UPDATE SKIP LOCKED under a lease (locked_until + lock_token).
CREATE TABLE outbox_event (
    id             uuid        PRIMARY KEY,              -- UUIDv7 made by the app: time-ordered
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    aggregate_seq  bigint      NOT NULL,                 -- per-aggregate order (see outbox_aggregate)
    topic          text        NOT NULL,
    event_type     text        NOT NULL,                 -- versioned, e.g. payment.requested.v1
    payload        jsonb       NOT NULL,
    headers        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    status         text        NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'published', 'dead')),
    created_at     timestamptz NOT NULL DEFAULT now(),
    available_at   timestamptz NOT NULL DEFAULT now(),
    locked_until   timestamptz,
    lock_token     uuid,
    attempts       integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error     text,
    published_at   timestamptz,
    dead_at        timestamptz,
    dead_reason    text,
    CHECK (length(topic) BETWEEN 1 AND 200),
    CHECK (length(event_type) BETWEEN 1 AND 200),
    UNIQUE (aggregate_type, aggregate_id, aggregate_seq)
);

-- The claim reads pending rows in id order (UUIDv7 = creation order). The
-- index holds pending rows only, so claims and dashboard counts cost
-- O(pending), never O(history): the claim's ORDER BY id is this index's order.
CREATE INDEX outbox_event_pending_idx ON outbox_event (id) WHERE status = 'pending';
-- Ordering per aggregate: "is an earlier event of this aggregate still pending?"
CREATE INDEX outbox_event_pending_aggregate_idx
    ON outbox_event (aggregate_type, aggregate_id, aggregate_seq) WHERE status = 'pending';
-- Dead letters are few; the console lists them and counts them.
CREATE INDEX outbox_event_dead_idx ON outbox_event (dead_at DESC, id) WHERE status = 'dead';
-- Pruning walks published rows oldest first.
CREATE INDEX outbox_event_published_idx ON outbox_event (published_at) WHERE status = 'published';

-- Per-aggregate sequence counter. A counter row (not max(aggregate_seq)) so
-- pruning history never restarts a sequence, and so concurrent writers of one
-- aggregate are serialized by the row lock: sequence order = commit order.
CREATE TABLE outbox_aggregate (
    aggregate_type text   NOT NULL,
    aggregate_id   text   NOT NULL,
    last_seq       bigint NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
);

-- internal/inbox -----------------------------------------------------------
CREATE TABLE inbox_message (
    consumer     text        NOT NULL,
    message_id   text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX inbox_message_processed_idx ON inbox_message (processed_at);

-- Highest applied per-aggregate sequence per consumer: older versions are
-- dropped as stale (seed 000).
CREATE TABLE inbox_aggregate_version (
    consumer       text   NOT NULL,
    aggregate_type text   NOT NULL,
    aggregate_id   text   NOT NULL,
    last_seq       bigint NOT NULL,
    PRIMARY KEY (consumer, aggregate_type, aggregate_id)
);

-- Per-consumer counters for the console's inbox page.
CREATE TABLE inbox_consumer (
    consumer   text        PRIMARY KEY,
    processed  bigint      NOT NULL DEFAULT 0,
    duplicates bigint      NOT NULL DEFAULT 0,
    stale      bigint      NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- internal/payments --------------------------------------------------------
CREATE TABLE account (
    account_id bigint        PRIMARY KEY,
    currency   text          NOT NULL DEFAULT 'TRY',
    balance    numeric(18,2) NOT NULL DEFAULT 0,
    reserved   numeric(18,2) NOT NULL DEFAULT 0,
    updated_at timestamptz   NOT NULL DEFAULT now(),
    -- the last line of defence: no code path may take an account negative
    CONSTRAINT account_balance_nonnegative CHECK (balance >= 0),
    CONSTRAINT account_reserved_nonnegative CHECK (reserved >= 0),
    CONSTRAINT account_reserved_covered CHECK (reserved <= balance)
);

CREATE TABLE idempotency_record (
    merchant_id     text        NOT NULL,
    idempotency_key text        NOT NULL,
    request_hash    text        NOT NULL,
    status          text        NOT NULL DEFAULT 'processing'
                    CHECK (status IN ('processing', 'completed', 'failed', 'unknown')),
    operation_id    uuid        NOT NULL,
    response_status integer,
    response_body   jsonb,
    locked_until    timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL DEFAULT now() + interval '72 hours',
    PRIMARY KEY (merchant_id, idempotency_key),
    CHECK (length(idempotency_key) BETWEEN 1 AND 255)
);
CREATE UNIQUE INDEX idempotency_record_operation_idx ON idempotency_record (operation_id);
-- Recovery finds expired leases among the few processing rows.
CREATE INDEX idempotency_record_processing_idx ON idempotency_record (locked_until)
    WHERE status = 'processing';
CREATE INDEX idempotency_record_expires_idx ON idempotency_record (expires_at);

CREATE TABLE payment (
    operation_id        uuid          PRIMARY KEY,
    merchant_id         text          NOT NULL,
    invoice_id          text          NOT NULL,
    payment_type        text          NOT NULL DEFAULT 'charge',
    account_id          bigint        NOT NULL REFERENCES account (account_id),
    amount              numeric(18,2) NOT NULL CHECK (amount > 0),
    currency            text          NOT NULL,
    -- customer fields are encrypted (internal/pii envelope: key id beside the value)
    customer            jsonb         NOT NULL DEFAULT '{}'::jsonb,
    customer_email_bidx bytea,        -- blind index: HMAC, never the clear value
    status              text          NOT NULL DEFAULT 'processing'
                        CHECK (status IN ('processing', 'completed', 'failed', 'unknown')),
    provider_ref        text,
    failure_code        text,
    unknown_since       timestamptz,
    next_inquiry_at     timestamptz,
    inquiry_attempts    integer       NOT NULL DEFAULT 0,
    resolved_at         timestamptz,
    resolved_by         text,
    created_at          timestamptz   NOT NULL DEFAULT now(),
    updated_at          timestamptz   NOT NULL DEFAULT now(),
    -- second line of defence against clients that mint a new key per retry
    CONSTRAINT payment_business_identity UNIQUE (merchant_id, invoice_id, payment_type)
);
-- The console and the reconcile worker look at the few unknown payments only.
CREATE INDEX payment_unknown_idx ON payment (unknown_since, operation_id) WHERE status = 'unknown';
CREATE INDEX payment_processing_idx ON payment (created_at) WHERE status = 'processing';
CREATE INDEX payment_status_created_idx ON payment (status, created_at DESC, operation_id);
CREATE INDEX payment_customer_email_bidx_idx ON payment (customer_email_bidx)
    WHERE customer_email_bidx IS NOT NULL;

CREATE TABLE balance_reservation (
    reservation_id bigserial     PRIMARY KEY,
    operation_id   uuid          NOT NULL UNIQUE REFERENCES payment (operation_id),
    account_id     bigint        NOT NULL REFERENCES account (account_id),
    amount         numeric(18,2) NOT NULL CHECK (amount > 0),
    status         text          NOT NULL DEFAULT 'active'
                   CHECK (status IN ('active', 'finalized', 'released')),
    expires_at     timestamptz,
    created_at     timestamptz   NOT NULL DEFAULT now(),
    updated_at     timestamptz   NOT NULL DEFAULT now()
);
CREATE INDEX balance_reservation_active_idx ON balance_reservation (account_id) WHERE status = 'active';

-- Append-only: corrections are reversals, never edits.
CREATE TABLE ledger_entry (
    entry_id     bigserial     PRIMARY KEY,
    operation_id uuid          NOT NULL,
    account_id   bigint        NOT NULL REFERENCES account (account_id),
    entry_type   text          NOT NULL CHECK (entry_type IN ('debit', 'credit', 'reversal')),
    amount       numeric(18,2) NOT NULL CHECK (amount > 0),
    currency     text          NOT NULL,
    reverses     bigint        REFERENCES ledger_entry (entry_id),
    memo         text,
    created_at   timestamptz   NOT NULL DEFAULT now()
);
CREATE INDEX ledger_entry_operation_idx ON ledger_entry (operation_id);
CREATE INDEX ledger_entry_account_idx ON ledger_entry (account_id, entry_id);

-- internal/audit -----------------------------------------------------------
CREATE TABLE audit_event (
    seq          bigserial   PRIMARY KEY,
    occurred_at  timestamptz NOT NULL DEFAULT clock_timestamp(),  -- the database clock
    actor_iss    text        NOT NULL DEFAULT '',
    actor_sub    text        NOT NULL DEFAULT '',
    actor_name   text        NOT NULL DEFAULT '',
    actor_roles  text[]      NOT NULL DEFAULT '{}',
    action       text        NOT NULL,
    target_type  text        NOT NULL DEFAULT '',
    target_id    text        NOT NULL DEFAULT '',
    before       jsonb,                                -- masked
    after        jsonb,                                -- masked
    reason       text        NOT NULL DEFAULT '',
    evidence     text        NOT NULL DEFAULT '',
    request_id   text        NOT NULL DEFAULT '',
    session_hash text        NOT NULL DEFAULT '',
    ip           text        NOT NULL DEFAULT '',
    user_agent   text        NOT NULL DEFAULT '',
    outcome      text        NOT NULL CHECK (outcome IN ('ok', 'denied', 'error')),
    error_code   text        NOT NULL DEFAULT '',
    prev_hash    bytea       NOT NULL,
    hash         bytea       NOT NULL
);
CREATE INDEX audit_event_action_idx ON audit_event (action, seq DESC);
CREATE INDEX audit_event_target_idx ON audit_event (target_type, target_id, seq DESC);
CREATE INDEX audit_event_actor_idx ON audit_event (actor_iss, actor_sub, seq DESC);

-- Immutable trails: triggers refuse changes even for roles the grants would
-- allow (row triggers do not fire on TRUNCATE, hence the statement trigger).
-- +goose StatementBegin
CREATE FUNCTION sluice_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% on % is not allowed: the table is append-only', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END
$$;
-- +goose StatementEnd
CREATE TRIGGER audit_event_no_update BEFORE UPDATE OR DELETE ON audit_event
    FOR EACH ROW EXECUTE FUNCTION sluice_refuse_change();
CREATE TRIGGER audit_event_no_truncate BEFORE TRUNCATE ON audit_event
    FOR EACH STATEMENT EXECUTE FUNCTION sluice_refuse_change();
CREATE TRIGGER ledger_entry_no_update BEFORE UPDATE OR DELETE ON ledger_entry
    FOR EACH ROW EXECUTE FUNCTION sluice_refuse_change();
CREATE TRIGGER ledger_entry_no_truncate BEFORE TRUNCATE ON ledger_entry
    FOR EACH STATEMENT EXECUTE FUNCTION sluice_refuse_change();

-- internal/auth ------------------------------------------------------------
CREATE TABLE console_session (
    id_hash        bytea       PRIMARY KEY,        -- sha256 of the opaque cookie value
    issuer         text        NOT NULL,
    subject        text        NOT NULL,
    name           text        NOT NULL DEFAULT '',
    roles          text[]      NOT NULL,
    auth_time      timestamptz NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    last_seen_at   timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL,            -- absolute lifetime
    csrf_secret    bytea       NOT NULL,
    id_token_hint  text        NOT NULL DEFAULT ''  -- for RP-initiated logout
);
CREATE INDEX console_session_expires_idx ON console_session (expires_at);
CREATE INDEX console_session_subject_idx ON console_session (issuer, subject);

-- +goose Down
-- Append-only history: the schema is never rolled back by this tool.
SELECT 1;
