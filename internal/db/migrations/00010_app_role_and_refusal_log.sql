-- internal/db and internal/auth: the trail must survive the application's
-- own database role.
--
-- db_app_role records the roles `console db grant` set up as application
-- roles (owning nothing; INSERT and SELECT only on the append-only trails).
-- `console migrate` re-applies the grants for every recorded role after it
-- applies migrations, so a table added by a later release is usable by the
-- services at once and the append-only tables never gain UPDATE or DELETE.
-- The application role itself gets no privilege on this table.
--
-- console_refusal is the refusal log: requests refused before anyone signed
-- in (cross-site POSTs, anonymous POSTs, anonymous sign-out) are counted in
-- a metric and written here, rate-limited per client IP, instead of each
-- becoming a permanent row of the audit chain: anyone on the network could
-- otherwise grow the chain without bound. It is pruned after a retention
-- window (`console prune`), hence the index on the time. It carries the
-- route template, a reason word, the client IP and the request id: never
-- cookies, tokens, raw paths or user agents.

-- +goose Up
CREATE TABLE db_app_role (
    role_name  text        PRIMARY KEY,
    granted_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE console_refusal (
    refusal_id  bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    refused_at  timestamptz NOT NULL DEFAULT now(),
    route       text        NOT NULL, -- method and route template, e.g. "POST /logout"
    reason      text        NOT NULL, -- cross_origin, no_session, ...
    ip          text        NOT NULL,
    request_id  text        NOT NULL  -- the id the refused client was shown, to find the log line
);
CREATE INDEX console_refusal_refused_at_idx ON console_refusal (refused_at);

-- +goose Down
-- Append-only history: the schema is never rolled back by this tool.
SELECT 1;
