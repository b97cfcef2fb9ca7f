-- internal/auth: a session's roles are re-checked at the provider every
-- CONSOLE_ROLE_RECHECK, so a user whose group is removed there loses the
-- console within minutes instead of at the end of the session's lifetime.
-- The refresh token is what the re-check presents to the provider (it is a
-- credential: it never leaves this table, and dies with the session row);
-- roles_checked_at is when the roles were last read from a verified token.

-- +goose Up
ALTER TABLE console_session
    ADD COLUMN refresh_token    text        NOT NULL DEFAULT '',
    ADD COLUMN roles_checked_at timestamptz NOT NULL DEFAULT now();

-- +goose Down
-- Append-only history: the schema is never rolled back by this tool.
SELECT 1;
