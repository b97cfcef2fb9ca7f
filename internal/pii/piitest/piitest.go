// Package piitest makes keyrings for tests and writes legacy (v1) envelopes
// the way releases before envelope v2 did, so tests can prove old values
// still open and that rotation rewrites them. Imported by tests only.
package piitest

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"testing"

	"github.com/sluice-dev/sluice/internal/pii"
)

// Key is a fresh random data key named id.
func Key(t testing.TB, id string) pii.Key {
	t.Helper()
	return pii.Key{ID: id, Secret: Bytes(t, 32)}
}

// Bytes is n random bytes (a blind-index key, a secret).
func Bytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// Ring is a keyring of keys (the first is the primary) and blind.
func Ring(t testing.TB, blind []byte, keys ...pii.Key) *pii.Keyring {
	t.Helper()
	kr, err := pii.NewKeyring(keys, blind)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// SealV1 writes value as a v1 envelope under k, bound to field only: what
// payments stored before envelope v2 (written here independently of the
// package, so the format itself is pinned).
func SealV1(t testing.TB, k pii.Key, field, value string) string {
	t.Helper()
	block, err := aes.NewCipher(k.Secret)
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	nonce := Bytes(t, aead.NonceSize())
	sealed := aead.Seal(nonce, nonce, []byte(value), []byte(field))
	return "enc:v1:" + k.ID + ":" + base64.RawURLEncoding.EncodeToString(sealed)
}
