package auth

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
)

// A session keeps two provider tokens: the refresh token the role re-check
// presents, and the ID token sent as a hint at sign-out (a signed JWT with
// the person's name and e-mail). Both are credentials or personal data, so
// console_session holds them sealed with AES-256-GCM under a key derived
// from the session's cookie value. The database keeps only the cookie's
// sha256, from which the key cannot be derived: whoever reads the table (a
// backup, a replica, a query elsewhere) gets no token, and only a request
// carrying the cookie — the one moment the console needs them — opens them.
// The row's id hash and the column are the seal's associated data, so a
// sealed value moved to another row or column does not open.

// Token columns (associated data).
const (
	columnRefreshToken = "refresh_token"
	columnIDTokenHint  = "id_token_hint"
)

// sealedPrefix marks a sealed token (version 1); empty means no token.
const sealedPrefix = "s1."

var errSealedToken = errors.New("auth: a session token does not open with its cookie")

// sealKeyOf derives a session's sealing key from its cookie value. The
// label keeps it apart from the id hash (plain sha256 of the same value).
func sealKeyOf(cookie string) []byte {
	k, err := hkdf.Key(sha256.New, []byte(cookie), nil, "sluice.console.session.tokens.v1", 32)
	if err != nil { // only for lengths HKDF cannot give; 32 is fine
		panic(err)
	}
	return k
}

func (s *Session) aead() (cipher.AEAD, error) {
	if len(s.sealKey) != 32 {
		return nil, errors.New("auth: the session has no sealing key")
	}
	block, err := aes.NewCipher(s.sealKey)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func (s *Session) aad(column string) []byte {
	return append([]byte(column+"\x00"), s.IDHash...)
}

// seal returns value sealed for this session's column ("" stays "").
func (s *Session) seal(column, value string) (string, error) {
	if value == "" {
		return "", nil
	}
	g, err := s.aead()
	if err != nil {
		return "", err
	}
	nonce := make([]byte, g.NonceSize(), g.NonceSize()+len(value)+g.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	return sealedPrefix + base64.RawURLEncoding.EncodeToString(g.Seal(nonce, nonce, []byte(value), s.aad(column))), nil
}

// open reverses seal; anything else than a value sealed for this session's
// column is an error.
func (s *Session) open(column, sealed string) (string, error) {
	if sealed == "" {
		return "", nil
	}
	rest, ok := strings.CutPrefix(sealed, sealedPrefix)
	if !ok {
		return "", errSealedToken
	}
	raw, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return "", errSealedToken
	}
	g, err := s.aead()
	if err != nil {
		return "", err
	}
	if len(raw) < g.NonceSize() {
		return "", errSealedToken
	}
	plain, err := g.Open(nil, raw[:g.NonceSize()], raw[g.NonceSize():], s.aad(column))
	if err != nil {
		return "", errSealedToken
	}
	return string(plain), nil
}
