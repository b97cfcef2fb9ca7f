package payments

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
)

// Merchants of the payments API authenticate with API keys. A key is
// "slk_<key_id>_<secret>": key_id (16 hex digits) is public and names the
// key in listings, logs and revocations; the secret (32 random bytes, hex)
// is printed once when the key is created and never stored: the database
// keeps SHA-256 of the whole key. SHA-256 without a salt is enough because
// the key is 256 random bits, not a password that could be guessed.

// Sentinel errors of merchants and keys.
var (
	ErrUnauthenticated = errors.New("payments: missing, unknown or revoked API key")
	ErrMerchantExists  = errors.New("payments: merchant exists")
	ErrAccountOwned    = errors.New("payments: account belongs to another merchant")
)

const keyPrefix = "slk_"

var merchantPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// ValidMerchantID reports whether id is 1–64 letters, digits, '.', '_' or
// '-', starting with a letter or digit (the merchant table's CHECK).
func ValidMerchantID(id string) bool { return merchantPattern.MatchString(id) }

// Merchant is one merchant row.
type Merchant struct {
	MerchantID string
	Name       string
	CreatedAt  time.Time
}

// APIKey describes a key without its secret.
type APIKey struct {
	KeyID      string
	MerchantID string
	CreatedAt  time.Time
	RevokedAt  *time.Time
}

// CreateMerchant adds a merchant (ErrMerchantExists when the id is taken).
func CreateMerchant(ctx context.Context, q db.Beginner, id, name string) error {
	if !ValidMerchantID(id) {
		return fmt.Errorf("payments: merchant id %q must be 1–64 letters, digits, '.', '_' or '-'", id)
	}
	return db.WithTx(ctx, q, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO merchant (merchant_id, name) VALUES ($1, $2) ON CONFLICT DO NOTHING`, id, name)
		if err != nil {
			return fmt.Errorf("payments: create merchant: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return ErrMerchantExists
		}
		return nil
	})
}

// GetMerchant reads one merchant.
func GetMerchant(ctx context.Context, q db.RowQuerier, id string) (Merchant, error) {
	var m Merchant
	err := q.QueryRow(ctx, `SELECT merchant_id, name, created_at FROM merchant WHERE merchant_id = $1`, id).Scan(&m.MerchantID, &m.Name, &m.CreatedAt)
	return m, notFound(err)
}

// CreateKey makes a new API key for the merchant and returns it with its
// description. The key itself exists only in the return value: show it once
// and never log it.
func CreateKey(ctx context.Context, q db.RowQuerier, merchantID string) (string, APIKey, error) {
	var idb [8]byte
	var secret [32]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return "", APIKey{}, fmt.Errorf("payments: create key: %w", err)
	}
	if _, err := rand.Read(secret[:]); err != nil {
		return "", APIKey{}, fmt.Errorf("payments: create key: %w", err)
	}
	keyID := hex.EncodeToString(idb[:])
	key := keyPrefix + keyID + "_" + hex.EncodeToString(secret[:])
	sum := sha256.Sum256([]byte(key))
	k := APIKey{KeyID: keyID, MerchantID: merchantID}
	err := q.QueryRow(ctx, `INSERT INTO merchant_api_key (key_id, merchant_id, key_hash) VALUES ($1, $2, $3) RETURNING created_at`,
		keyID, merchantID, sum[:]).Scan(&k.CreatedAt)
	if db.Code(err) == db.CodeForeignKeyViolation {
		return "", APIKey{}, fmt.Errorf("payments: no merchant %q: %w", merchantID, ErrNotFound)
	}
	if err != nil {
		return "", APIKey{}, fmt.Errorf("payments: create key: %w", err)
	}
	return key, k, nil
}

// ListKeys lists a merchant's keys, oldest first, without secrets.
func ListKeys(ctx context.Context, q db.Querier, merchantID string) ([]APIKey, error) {
	rows, err := q.Query(ctx, `SELECT key_id, merchant_id, created_at, revoked_at FROM merchant_api_key WHERE merchant_id = $1 ORDER BY created_at, key_id`, merchantID)
	if err != nil {
		return nil, fmt.Errorf("payments: list keys: %w", err)
	}
	defer rows.Close()
	var out []APIKey
	for rows.Next() {
		var k APIKey
		if err := rows.Scan(&k.KeyID, &k.MerchantID, &k.CreatedAt, &k.RevokedAt); err != nil {
			return nil, fmt.Errorf("payments: list keys: %w", err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("payments: list keys: %w", err)
	}
	return out, nil
}

// RevokeKey revokes a key at once (every later request with it is 401).
// Revoking a revoked key changes nothing; an unknown key id is ErrNotFound.
func RevokeKey(ctx context.Context, q db.RowQuerier, keyID string) (APIKey, error) {
	var k APIKey
	err := q.QueryRow(ctx, `
		UPDATE merchant_api_key SET revoked_at = coalesce(revoked_at, now())
		WHERE key_id = $1
		RETURNING key_id, merchant_id, created_at, revoked_at`, strings.ToLower(keyID)).Scan(&k.KeyID, &k.MerchantID, &k.CreatedAt, &k.RevokedAt)
	return k, notFound(err)
}

// dummyHash is compared against when a key id is unknown, so an unknown id
// costs the same comparison as a known one.
var dummyHash = sha256.Sum256([]byte("sluice: no such key"))

// Authenticate returns the merchant and key id of an API key, or
// ErrUnauthenticated for a malformed, unknown or revoked key. The key is
// found by its public id and its hash compared in constant time, so the
// lookup leaks nothing about the secret.
func Authenticate(ctx context.Context, q db.RowQuerier, key string) (merchantID, keyID string, err error) {
	rest, ok := strings.CutPrefix(key, keyPrefix)
	if !ok || len(rest) != 16+1+64 || rest[16] != '_' {
		return "", "", ErrUnauthenticated
	}
	keyID = rest[:16]
	if _, err := hex.DecodeString(keyID); err != nil {
		return "", "", ErrUnauthenticated
	}
	var stored []byte
	var revoked *time.Time
	err = q.QueryRow(ctx, `SELECT merchant_id, key_hash, revoked_at FROM merchant_api_key WHERE key_id = $1`, keyID).Scan(&merchantID, &stored, &revoked)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", "", fmt.Errorf("payments: read API key %s: %w", keyID, err)
	}
	if stored == nil {
		stored = dummyHash[:]
	}
	sum := sha256.Sum256([]byte(key))
	match := subtle.ConstantTimeCompare(sum[:], stored) == 1
	if err != nil || !match || revoked != nil {
		return "", "", ErrUnauthenticated
	}
	return merchantID, keyID, nil
}

// AssignAccount gives an existing account to a merchant. An account owned
// by another merchant is never moved (ErrAccountOwned): taking money rights
// away from a merchant is not something a typo should do.
func AssignAccount(ctx context.Context, q db.RowQuerier, merchantID string, accountID int64) error {
	var owner string
	err := q.QueryRow(ctx, `
		UPDATE account SET merchant_id = $1, updated_at = now()
		WHERE account_id = $2 AND (merchant_id IS NULL OR merchant_id = $1)
		RETURNING merchant_id`, merchantID, accountID).Scan(&owner)
	switch {
	case db.Code(err) == db.CodeForeignKeyViolation:
		return fmt.Errorf("payments: no merchant %q: %w", merchantID, ErrNotFound)
	case err == nil:
		return nil
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("payments: assign account %d: %w", accountID, err)
	}
	var exists bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM account WHERE account_id = $1)`, accountID).Scan(&exists); err != nil {
		return fmt.Errorf("payments: assign account %d: %w", accountID, err)
	}
	if !exists {
		return fmt.Errorf("payments: no account %d: %w", accountID, ErrNotFound)
	}
	return fmt.Errorf("payments: account %d: %w", accountID, ErrAccountOwned)
}

// MerchantAccounts lists the ids of a merchant's accounts.
func MerchantAccounts(ctx context.Context, q db.Querier, merchantID string) ([]int64, error) {
	rows, err := q.Query(ctx, `SELECT account_id FROM account WHERE merchant_id = $1 ORDER BY account_id`, merchantID)
	if err != nil {
		return nil, fmt.Errorf("payments: accounts of %s: %w", merchantID, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("payments: accounts of %s: %w", merchantID, err)
	}
	return ids, nil
}
