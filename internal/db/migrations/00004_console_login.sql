-- internal/auth: pending OIDC logins. The state of each login attempt is kept
-- server-side (hashed) so it is one-time even across console replicas: the
-- callback consumes it with DELETE … RETURNING, a replay finds nothing. The
-- browser binding (a short-lived cookie, hashed here too) stops login CSRF.

-- +goose Up
CREATE TABLE console_login (
    state_hash   bytea       PRIMARY KEY,   -- sha256 of the state parameter
    binding_hash bytea       NOT NULL,      -- sha256 of the browser's login cookie
    nonce        text        NOT NULL,
    pkce_verifier text       NOT NULL,
    next_path    text        NOT NULL DEFAULT '/',
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);
CREATE INDEX console_login_expires_idx ON console_login (expires_at);

-- +goose Down
DROP TABLE console_login;
