-- internal/auth: a session's refresh token and ID token hint are sealed
-- (AES-GCM) under a key derived from the session's cookie value, which the
-- database never holds (it keeps its sha256). A copy of this table (a
-- backup, a replica, a stray SELECT) then yields neither a session nor a
-- credential the provider would honour. Sessions written before this held
-- both in clear: they are ended here, and their users sign in again once.

-- +goose Up
DELETE FROM console_session;
COMMENT ON COLUMN console_session.refresh_token IS 'sealed with the session''s cookie-derived key (internal/auth), or empty';
COMMENT ON COLUMN console_session.id_token_hint IS 'sealed with the session''s cookie-derived key (internal/auth), or empty';

-- +goose Down
-- Append-only history: the schema is never rolled back by this tool.
SELECT 1;
