package auth

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNoSession means the cookie names no live session (unknown, expired,
// idle too long or logged out).
var ErrNoSession = errors.New("auth: no session")

// Session is a signed-in member of staff. The cookie carries a random
// 256-bit value; only its sha256 is stored.
type Session struct {
	IDHash      []byte
	Issuer      string
	Subject     string
	Name        string
	Roles       []Role
	AuthTime    time.Time
	ExpiresAt   time.Time
	IDTokenHint string
	// RolesCheckedAt is when the roles were last read from a verified token
	// (login or the periodic re-check).
	RolesCheckedAt time.Time
	csrfSecret     []byte
	refreshToken   string // what the re-check presents to the provider; never logged
	// sealKey seals and opens the two tokens in console_session: derived
	// from the cookie value, so only a request that carries the cookie
	// can read them (sealing.go).
	sealKey []byte
}

// Can reports whether the session's roles grant p.
func (s *Session) Can(p Permission) bool { return Can(s.Roles, p) }

// HashHex is the session's id hash for audit records and the websocket hub
// (never the id itself).
func (s *Session) HashHex() string { return hex.EncodeToString(s.IDHash) }

// RoleNames are the roles as strings (for audit and display).
func (s *Session) RoleNames() []string { return roleStrings(s.Roles) }

// CSRFToken is the token every POST of this session must carry. It is
// derived from the session's own secret, so it dies with the session.
func (s *Session) CSRFToken() string {
	m := hmac.New(sha256.New, s.csrfSecret)
	m.Write([]byte("sluice.csrf.v1"))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// CheckCSRF compares token with the session's in constant time.
func (s *Session) CheckCSRF(token string) bool {
	if token == "" {
		return false
	}
	return hmac.Equal([]byte(token), []byte(s.CSRFToken()))
}

// Sessions stores sessions in console_session.
type Sessions struct {
	pool     *pgxpool.Pool
	lifetime time.Duration // absolute: a login is never valid longer than this
	idle     time.Duration // without a request for this long, the session ends
	now      func() time.Time
}

// NewSessions builds the store. now may be nil (time.Now).
func NewSessions(pool *pgxpool.Pool, lifetime, idle time.Duration, now func() time.Time) *Sessions {
	if now == nil {
		now = time.Now
	}
	return &Sessions{pool: pool, lifetime: lifetime, idle: idle, now: now}
}

// HashToken is sha256 of a cookie value.
func HashToken(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

func randomToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// create inserts a fresh session in tx and returns its cookie value. A new
// id at every login: whatever id the browser held before is worthless.
func (s *Sessions) create(ctx context.Context, tx pgx.Tx, sess *Session) (string, error) {
	token, err := randomToken()
	if err != nil {
		return "", err
	}
	sess.csrfSecret = make([]byte, 32)
	if _, err := rand.Read(sess.csrfSecret); err != nil {
		return "", err
	}
	now := s.now()
	sess.IDHash = HashToken(token)
	sess.ExpiresAt = now.Add(s.lifetime)
	sess.RolesCheckedAt = now
	sess.sealKey = sealKeyOf(token)
	hint, err := sess.seal(columnIDTokenHint, sess.IDTokenHint)
	if err != nil {
		return "", err
	}
	refresh, err := sess.seal(columnRefreshToken, sess.refreshToken)
	if err != nil {
		return "", err
	}
	_, err = tx.Exec(ctx, `
		INSERT INTO console_session (id_hash, issuer, subject, name, roles, auth_time, created_at,
			last_seen_at, expires_at, csrf_secret, id_token_hint, refresh_token, roles_checked_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8, $9, $10, $11, $7)`,
		sess.IDHash, sess.Issuer, sess.Subject, sess.Name, sess.RoleNames(), sess.AuthTime, now,
		sess.ExpiresAt, sess.csrfSecret, hint, refresh)
	if err != nil {
		return "", fmt.Errorf("auth: create session: %w", err)
	}
	return token, nil
}

const sessionColumns = `id_hash, issuer, subject, name, roles, auth_time, expires_at, csrf_secret, id_token_hint,
	refresh_token, roles_checked_at`

// scanSession reads a session row and opens its tokens with sealKey (the
// key of the cookie that named it). Tokens that do not open were sealed for
// another row or altered: such a row is no session.
func scanSession(row pgx.Row, sealKey []byte) (*Session, error) {
	var (
		sess          Session
		roles         []string
		hint, refresh string
	)
	err := row.Scan(&sess.IDHash, &sess.Issuer, &sess.Subject, &sess.Name, &roles, &sess.AuthTime,
		&sess.ExpiresAt, &sess.csrfSecret, &hint, &refresh, &sess.RolesCheckedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNoSession
	}
	if err != nil {
		return nil, fmt.Errorf("auth: read session: %w", err)
	}
	for _, r := range roles {
		sess.Roles = append(sess.Roles, Role(r))
	}
	sess.sealKey = sealKey
	if sess.IDTokenHint, err = sess.open(columnIDTokenHint, hint); err != nil {
		return nil, ErrNoSession
	}
	if sess.refreshToken, err = sess.open(columnRefreshToken, refresh); err != nil {
		return nil, ErrNoSession
	}
	return &sess, nil
}

// Touch finds the live session of a cookie value and records the request
// (which restarts the idle timer) in one statement.
func (s *Sessions) Touch(ctx context.Context, token string) (*Session, error) {
	if token == "" {
		return nil, ErrNoSession
	}
	now := s.now()
	return scanSession(s.pool.QueryRow(ctx, `
		UPDATE console_session SET last_seen_at = $2
		WHERE id_hash = $1 AND expires_at > $2 AND last_seen_at > $3
		RETURNING `+sessionColumns, HashToken(token), now, now.Add(-s.idle)), sealKeyOf(token))
}

// Peek finds the live session of a cookie value without counting the
// request as activity (a refused request must not keep a session alive).
func (s *Sessions) Peek(ctx context.Context, token string) (*Session, error) {
	if token == "" {
		return nil, ErrNoSession
	}
	now := s.now()
	return scanSession(s.pool.QueryRow(ctx, `
		SELECT `+sessionColumns+` FROM console_session
		WHERE id_hash = $1 AND expires_at > $2 AND last_seen_at > $3`, HashToken(token), now, now.Add(-s.idle)), sealKeyOf(token))
}

// Alive reports whether the session with this id hash is still valid,
// without counting as activity (the websocket's periodic re-check).
func (s *Sessions) Alive(ctx context.Context, idHash []byte) (bool, error) {
	now := s.now()
	var ok bool
	err := s.pool.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM console_session
		               WHERE id_hash = $1 AND expires_at > $2 AND last_seen_at > $3)`,
		idHash, now, now.Add(-s.idle)).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("auth: check session: %w", err)
	}
	return ok, nil
}

// deleteByHash ends a session in tx.
func (s *Sessions) deleteByHash(ctx context.Context, tx pgx.Tx, idHash []byte) error {
	if _, err := tx.Exec(ctx, `DELETE FROM console_session WHERE id_hash = $1`, idHash); err != nil {
		return fmt.Errorf("auth: delete session: %w", err)
	}
	return nil
}

// Purge deletes expired sessions and abandoned login attempts.
func (s *Sessions) Purge(ctx context.Context) error {
	now := s.now()
	if _, err := s.pool.Exec(ctx, `DELETE FROM console_session WHERE expires_at <= $1 OR last_seen_at <= $2`, now, now.Add(-s.idle)); err != nil {
		return fmt.Errorf("auth: purge sessions: %w", err)
	}
	if _, err := s.pool.Exec(ctx, `DELETE FROM console_login WHERE expires_at <= $1`, now); err != nil {
		return fmt.Errorf("auth: purge logins: %w", err)
	}
	return nil
}
