// Package pii protects personal data: a keyring encrypts each value with
// AES-256-GCM under a key id carried beside the value and binds it to its
// place (table or event type, record id, field); a field schema
// (schema.go) says which fields are personal and how each is masked; a
// blind index makes encrypted values searchable by equality; and masking
// rules decide what a screen, a log line or an audit record may show
// (default-deny: only fields declared safe appear in clear).
//
// Keys: PII_KEYS is "id:base64key,..." (32-byte AES keys); the first key
// encrypts, every key decrypts. To rotate, put a new key first and keep the
// old ones listed: old values still open, new values use the new id, and
// `console pii rotate` rewrites the old ones at leisure. Back every key up
// outside the database (a secrets manager, or an offline copy): a value
// whose key is lost cannot be recovered and shows as "undecryptable".
// Rotating PII_BLIND_INDEX_KEY breaks equality lookups of existing blind
// indexes (and idempotency request hashes still inside their retry window),
// so rotate it only with a re-index.
package pii

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode"
)

// Envelope formats. Both carry the key id in clear beside the value, so a
// ring holding several keys knows which one opens it:
//
//	enc:v1:<kid>:<base64url(nonce|ciphertext)>  AAD = the field name only
//	enc:v2:<kid>:<base64url(nonce|ciphertext)>  AAD = place kind, place id, field
//
// v1 is read only: it bound a value to its field but not to its row, so a
// ciphertext copied to another payment opened there. `console pii rotate`
// rewrites every v1 value as v2.
const (
	envelopeV1 = "enc:v1:"
	envelopeV2 = "enc:v2:"
)

// Envelope versions, as `console pii check` reports them.
const (
	V1 = "v1"
	V2 = "v2"
)

// Place is where a value lives: the table or event type (Kind) and the
// record's id (ID). v2 envelopes bind it, with the field, as AEAD
// associated data, so a value moved to another row, field or event type no
// longer opens.
type Place struct {
	Kind string // a table ("payment") or an event type ("payment.requested.v1")
	ID   string // the row's primary key or the event id
}

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

// GenerateKey makes one fresh data key as a PII_KEYS entry "kid:base64key"
// (`console pii keygen`). Put it first in PII_KEYS to make it the primary.
func GenerateKey(kid string) (string, error) {
	if !kidPattern.MatchString(kid) {
		return "", fmt.Errorf("%w: key id %q must be 1–32 letters, digits, '-' or '_'", ErrBadKeyring, kid)
	}
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return "", fmt.Errorf("pii: random key: %w", err)
	}
	return kid + ":" + base64.StdEncoding.EncodeToString(k), nil
}

// KeyIDs lists the ring's key ids, the primary first.
func (kr *Keyring) KeyIDs() []string { return append([]string(nil), kr.order...) }

// PrimaryKeyID is the id new values are encrypted under.
func (kr *Keyring) PrimaryKeyID() string { return kr.primary }

// Seal encrypts value under the primary key as a v2 envelope bound to
// place and field.
func (kr *Keyring) Seal(place Place, field, value string) (string, error) {
	aead := kr.aeads[kr.primary]
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(value)+aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("pii: nonce: %w", err)
	}
	sealed := aead.Seal(nonce, nonce, []byte(value), aad(place, field))
	return envelopeV2 + kr.primary + ":" + base64.RawURLEncoding.EncodeToString(sealed), nil
}

// Open decrypts an envelope sealed for place and field under any key of the
// ring. A v1 envelope opens with the field alone (it never knew its place).
// Unknown key id → ErrUnknownKey (show Undecryptable); anything else wrong,
// including a value moved from another place or field → ErrMalformed.
func (kr *Keyring) Open(place Place, field, envelope string) (string, error) {
	e, err := parseEnvelope(envelope)
	if err != nil {
		return "", err
	}
	aead, ok := kr.aeads[e.kid]
	if !ok {
		return "", fmt.Errorf("%w %q", ErrUnknownKey, e.kid)
	}
	if len(e.sealed) < aead.NonceSize()+aead.Overhead() {
		return "", ErrMalformed
	}
	ad := []byte(field)
	if e.version == V2 {
		ad = aad(place, field)
	}
	plain, err := aead.Open(nil, e.sealed[:aead.NonceSize()], e.sealed[aead.NonceSize():], ad)
	if err != nil {
		return "", ErrMalformed
	}
	return string(plain), nil
}

// Current reports whether envelope is already what Seal writes today: v2
// under the primary key. Rotation rewrites every value that is not.
func (kr *Keyring) Current(envelope string) bool {
	return strings.HasPrefix(envelope, envelopeV2+kr.primary+":")
}

// Reseal rewrites envelope as a v2 value under the primary key for the same
// place and field, and reports whether it changed; a current value is
// returned as it is. The value is opened first, so nothing that does not
// open is ever rewritten (and lost).
func (kr *Keyring) Reseal(place Place, field, envelope string) (string, bool, error) {
	if kr.Current(envelope) {
		return envelope, false, nil
	}
	clear, err := kr.Open(place, field, envelope)
	if err != nil {
		return envelope, false, err
	}
	out, err := kr.Seal(place, field, clear)
	if err != nil {
		return envelope, false, err
	}
	return out, true, nil
}

// aad is the associated data of a v2 envelope: a domain word, then kind, id
// and field, each length-prefixed so no two places share an encoding
// ("a"+"bc" and "ab"+"c" differ).
func aad(place Place, field string) []byte {
	b := make([]byte, 0, 16+len(place.Kind)+len(place.ID)+len(field))
	b = append(b, "sluice-pii-v2"...)
	for _, s := range []string{place.Kind, place.ID, field} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	return b
}

// KeyID returns the key id an envelope was written under.
func KeyID(envelope string) (string, error) {
	e, err := parseEnvelope(envelope)
	return e.kid, err
}

// Version returns an envelope's format version (V1 or V2).
func Version(envelope string) (string, error) {
	e, err := parseEnvelope(envelope)
	return e.version, err
}

// IsEnvelope reports whether v looks like an encrypted value (any version).
func IsEnvelope(v string) bool {
	return strings.HasPrefix(v, envelopeV2) || strings.HasPrefix(v, envelopeV1)
}

type envelope struct {
	version, kid string
	sealed       []byte
}

func parseEnvelope(v string) (envelope, error) {
	var e envelope
	rest, ok := strings.CutPrefix(v, envelopeV2)
	e.version = V2
	if !ok {
		rest, ok = strings.CutPrefix(v, envelopeV1)
		e.version = V1
	}
	if !ok {
		return envelope{}, ErrMalformed
	}
	kid, b64, ok := strings.Cut(rest, ":")
	if !ok || !kidPattern.MatchString(kid) {
		return envelope{}, ErrMalformed
	}
	sealed, err := base64.RawURLEncoding.DecodeString(b64)
	if err != nil {
		return envelope{}, ErrMalformed
	}
	e.kid, e.sealed = kid, sealed
	return e, nil
}

// BlindIndex is HMAC-SHA256(blind key, field || 0 || normalised value): equal
// values give equal indexes, and the index reveals nothing without the key.
// Values are normalised first (see Normalize), so lookups ignore case and
// spacing where the field allows it.
func (kr *Keyring) BlindIndex(field, value string) []byte {
	m := hmac.New(sha256.New, kr.blind)
	m.Write([]byte(field))
	m.Write([]byte{0})
	m.Write([]byte(Normalize(field, value)))
	return m.Sum(nil)
}

// SearchHash is a keyed hash of a search an operator typed, for the audit
// record of that search: the same search gives the same hash (an auditor can
// tell two searches for one customer apart from searches for two), but it is
// not the blind index. It is an HMAC under a key derived from the blind-index
// key for this purpose only, so an audit reader cannot join it to the
// payment table's index columns, nor test guesses without the key.
func (kr *Keyring) SearchHash(field, typed string) string {
	derive := hmac.New(sha256.New, kr.blind)
	derive.Write([]byte("sluice-pii search-hash v1"))
	m := hmac.New(sha256.New, derive.Sum(nil))
	m.Write([]byte(field))
	m.Write([]byte{0})
	m.Write([]byte(Normalize(field, typed)))
	return "sh1:" + base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:18])
}

// MAC is a keyed hash of data under the blind-index key, for fingerprints
// (e.g. request hashes) that must not be guessable from low-entropy PII.
func (kr *Keyring) MAC(data []byte) []byte {
	m := hmac.New(sha256.New, kr.blind)
	m.Write([]byte("mac\x00"))
	m.Write(data)
	return m.Sum(nil)
}

// Normalize is the canonical form of a field's value for blind indexes and
// searches: surrounding space trimmed; emails lower-cased; tax ids without
// spaces, dashes or dots and upper-cased (letters appear in some countries'
// ids), so "123 456-78" and "12345678" are one customer.
func Normalize(field, value string) string {
	v := strings.TrimSpace(value)
	switch field {
	case FieldEmail:
		return strings.ToLower(v)
	case FieldTaxID:
		return strings.ToUpper(strings.Map(func(r rune) rune {
			if unicode.IsSpace(r) || r == '-' || r == '.' {
				return -1
			}
			return r
		}, v))
	}
	return v
}
