// Package pii protects personal data: a keyring encrypts each value with
// AES-256-GCM under a key id carried beside the value (so keys rotate without
// migrating data), a blind index makes encrypted values searchable by
// equality, and masking rules decide what a screen, a log line or an audit
// record may show (default-deny: only fields declared safe appear in clear).
//
// Keys: PII_KEYS is "id:base64key,..." (32-byte AES keys); the first key
// encrypts, every key decrypts. To rotate, put a new key first and keep the
// old ones listed: old values still open, new values use the new id, and no
// data migration is needed. Back every key up outside the database (a
// secrets manager, or an offline copy): a value whose key is lost cannot be
// recovered and shows as "undecryptable". Rotating PII_BLIND_INDEX_KEY breaks
// equality lookups of existing blind indexes (and idempotency request
// hashes still inside their retry window), so rotate it only with a re-index.
package pii

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Envelope format: enc:v1:<kid>:<base64url(nonce|ciphertext)>.
const envelopePrefix = "enc:v1:"

// Sentinel errors.
var (
	// ErrUnknownKey: the value was encrypted under a key id this keyring does
	// not hold. The console shows such a value as "undecryptable".
	ErrUnknownKey = errors.New("pii: unknown key id")
	// ErrMalformed: the value is not an envelope this package wrote, or it
	// was altered (GCM authentication failed).
	ErrMalformed = errors.New("pii: malformed or tampered value")
	// ErrBadKeyring: the keyring specification is invalid.
	ErrBadKeyring = errors.New("pii: invalid keyring")
)

// Undecryptable is what a screen shows for a value whose key is missing.
const Undecryptable = "undecryptable"

var kidPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// Keyring holds the data keys: the first (primary) encrypts, all decrypt.
type Keyring struct {
	primary string
	aeads   map[string]cipher.AEAD
	order   []string
	blind   []byte
}

// NewKeyring builds a keyring from (kid, 32-byte key) pairs, the first being
// the primary, and the blind-index HMAC key (at least 32 bytes).
func NewKeyring(keys []Key, blindIndexKey []byte) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no keys", ErrBadKeyring)
	}
	if len(blindIndexKey) < 32 {
		return nil, fmt.Errorf("%w: blind index key must be at least 32 bytes (got %d)", ErrBadKeyring, len(blindIndexKey))
	}
	kr := &Keyring{primary: keys[0].ID, aeads: make(map[string]cipher.AEAD, len(keys)), blind: append([]byte(nil), blindIndexKey...)}
	for _, k := range keys {
		if !kidPattern.MatchString(k.ID) {
			return nil, fmt.Errorf("%w: key id %q must be 1–32 letters, digits, '-' or '_'", ErrBadKeyring, k.ID)
		}
		if len(k.Secret) != 32 {
			return nil, fmt.Errorf("%w: key %q must be 32 bytes (AES-256), got %d", ErrBadKeyring, k.ID, len(k.Secret))
		}
		if _, dup := kr.aeads[k.ID]; dup {
			return nil, fmt.Errorf("%w: key id %q appears twice", ErrBadKeyring, k.ID)
		}
		block, err := aes.NewCipher(k.Secret)
		if err != nil {
			return nil, fmt.Errorf("%w: key %q: %v", ErrBadKeyring, k.ID, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("%w: key %q: %v", ErrBadKeyring, k.ID, err)
		}
		kr.aeads[k.ID] = aead
		kr.order = append(kr.order, k.ID)
	}
	return kr, nil
}

// Key is one data key.
type Key struct {
	ID     string
	Secret []byte
}

// ParseKeyring reads PII_KEYS ("id:base64key,..."; the first encrypts) and
// PII_BLIND_INDEX_KEY (base64). Error messages never contain key material.
func ParseKeyring(keysSpec, blindIndexKey string) (*Keyring, error) {
	var keys []Key
	for i, part := range strings.Split(keysSpec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, b64, ok := strings.Cut(part, ":")
		if !ok {
			return nil, fmt.Errorf("%w: PII_KEYS entry %d is not id:base64key", ErrBadKeyring, i+1)
		}
		secret, err := decodeB64(b64)
		if err != nil {
			return nil, fmt.Errorf("%w: PII_KEYS key %q is not base64", ErrBadKeyring, id)
		}
		keys = append(keys, Key{ID: strings.TrimSpace(id), Secret: secret})
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: PII_KEYS is empty", ErrBadKeyring)
	}
	blind, err := decodeB64(strings.TrimSpace(blindIndexKey))
	if err != nil {
		return nil, fmt.Errorf("%w: PII_BLIND_INDEX_KEY is not base64", ErrBadKeyring)
	}
	return NewKeyring(keys, blind)
}

func decodeB64(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			return b, nil
		}
	}
	return nil, errors.New("not base64")
}

// GenerateSpec makes a fresh keyring specification for demos and first
// installs: PII_KEYS with one key named kid, and a PII_BLIND_INDEX_KEY.
// Back both up: losing a key is losing the data encrypted under it.
func GenerateSpec(kid string) (keys, blindIndexKey string, err error) {
	k := make([]byte, 32)
	b := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return "", "", err
	}
	if _, err := rand.Read(b); err != nil {
		return "", "", err
	}
	return kid + ":" + base64.StdEncoding.EncodeToString(k), base64.StdEncoding.EncodeToString(b), nil
}

// PrimaryKeyID is the id new values are encrypted under.
func (kr *Keyring) PrimaryKeyID() string { return kr.primary }

// Encrypt seals plaintext under the primary key. The field name is bound as
// additional data, so a ciphertext moved to another field fails to open.
func (kr *Keyring) Encrypt(field, plaintext string) (string, error) {
	aead := kr.aeads[kr.primary]
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plaintext)+aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("pii: nonce: %w", err)
	}
	sealed := aead.Seal(nonce, nonce, []byte(plaintext), []byte(field))
	return envelopePrefix + kr.primary + ":" + base64.RawURLEncoding.EncodeToString(sealed), nil
}

// Decrypt opens an envelope written by Encrypt for the same field, under any
// key of the ring. Unknown key id → ErrUnknownKey; anything else wrong →
// ErrMalformed.
func (kr *Keyring) Decrypt(field, envelope string) (string, error) {
	kid, sealed, err := splitEnvelope(envelope)
	if err != nil {
		return "", err
	}
	aead, ok := kr.aeads[kid]
	if !ok {
		return "", fmt.Errorf("%w %q", ErrUnknownKey, kid)
	}
	if len(sealed) < aead.NonceSize()+aead.Overhead() {
		return "", ErrMalformed
	}
	plain, err := aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], []byte(field))
	if err != nil {
		return "", ErrMalformed
	}
	return string(plain), nil
}

// KeyID returns the key id an envelope was written under.
func KeyID(envelope string) (string, error) {
	kid, _, err := splitEnvelope(envelope)
	return kid, err
}

// IsEnvelope reports whether v looks like an encrypted value.
func IsEnvelope(v string) bool { return strings.HasPrefix(v, envelopePrefix) }

func splitEnvelope(envelope string) (string, []byte, error) {
	rest, ok := strings.CutPrefix(envelope, envelopePrefix)
	if !ok {
		return "", nil, ErrMalformed
	}
	kid, b64, ok := strings.Cut(rest, ":")
	if !ok || !kidPattern.MatchString(kid) {
		return "", nil, ErrMalformed
	}
	sealed, err := base64.RawURLEncoding.DecodeString(b64)
	if err != nil {
		return "", nil, ErrMalformed
	}
	return kid, sealed, nil
}

// BlindIndex is HMAC-SHA256(blind key, field || 0 || normalised value): equal
// values give equal indexes, and the index reveals nothing without the key.
// Emails are normalised (trimmed, lower-cased) so lookups ignore case.
func (kr *Keyring) BlindIndex(field, value string) []byte {
	m := hmac.New(sha256.New, kr.blind)
	m.Write([]byte(field))
	m.Write([]byte{0})
	m.Write([]byte(Normalize(field, value)))
	return m.Sum(nil)
}

// MAC is a keyed hash of data under the blind-index key, for fingerprints
// (e.g. request hashes) that must not be guessable from low-entropy PII.
func (kr *Keyring) MAC(data []byte) []byte {
	m := hmac.New(sha256.New, kr.blind)
	m.Write([]byte("mac\x00"))
	m.Write(data)
	return m.Sum(nil)
}

// Normalize is the canonical form of a field's value for blind indexes.
func Normalize(field, value string) string {
	v := strings.TrimSpace(value)
	switch field {
	case FieldEmail:
		return strings.ToLower(v)
	case FieldTaxID:
		return strings.Map(func(r rune) rune {
			if r == ' ' || r == '-' || r == '.' {
				return -1
			}
			return r
		}, v)
	}
	return v
}
