package pii

import (
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"unicode"
)

func newRing(t testing.TB, ids ...string) (*Keyring, []Key) {
	t.Helper()
	var keys []Key
	for _, id := range ids {
		s := make([]byte, 32)
		if _, err := rand.Read(s); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, Key{ID: id, Secret: s})
	}
	blind := make([]byte, 32)
	if _, err := rand.Read(blind); err != nil {
		t.Fatal(err)
	}
	kr, err := NewKeyring(keys, blind)
	if err != nil {
		t.Fatal(err)
	}
	return kr, keys
}

func TestEncryptRoundTripAndFieldBinding(t *testing.T) {
	t.Parallel()
	kr, _ := newRing(t, "k1")
	env, err := kr.Encrypt(FieldEmail, "ayse@example.com")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(env, "enc:v1:k1:") || strings.Contains(env, "ayse") {
		t.Fatalf("envelope %q: want enc:v1:k1: prefix and no clear text", env)
	}
	got, err := kr.Decrypt(FieldEmail, env)
	if err != nil || got != "ayse@example.com" {
		t.Fatalf("Decrypt = %q, %v", got, err)
	}
	if _, err := kr.Decrypt(FieldName, env); !errors.Is(err, ErrMalformed) {
		t.Fatalf("ciphertext moved to another field: err = %v, want ErrMalformed", err)
	}
	tampered := env[:len(env)-2] + "AA"
	if tampered == env {
		tampered = env[:len(env)-2] + "BB"
	}
	if _, err := kr.Decrypt(FieldEmail, tampered); !errors.Is(err, ErrMalformed) {
		t.Fatalf("tampered value: err = %v, want ErrMalformed", err)
	}
	env2, _ := kr.Encrypt(FieldEmail, "ayse@example.com")
	if env2 == env {
		t.Fatal("two encryptions of one value are equal: nonce reuse")
	}
}

// Keys rotate without migrating data: a ring whose primary is the new key
// still opens values written under the old one, and writes under the new one.
func TestRotationOldKeyStillDecrypts(t *testing.T) {
	t.Parallel()
	old, oldKeys := newRing(t, "2025a")
	envOld, err := old.Encrypt(FieldName, "Ayşe Yılmaz")
	if err != nil {
		t.Fatal(err)
	}
	rotated, err := NewKeyring([]Key{{ID: "2026a", Secret: make32()}, oldKeys[0]}, make32())
	if err != nil {
		t.Fatal(err)
	}
	got, err := rotated.Decrypt(FieldName, envOld)
	if err != nil || got != "Ayşe Yılmaz" {
		t.Fatalf("old value after rotation: %q, %v", got, err)
	}
	envNew, _ := rotated.Encrypt(FieldName, "Ayşe Yılmaz")
	if kid, _ := KeyID(envNew); kid != "2026a" {
		t.Fatalf("new values written under %q, want the primary 2026a", kid)
	}
	// The old ring does not know the new key: ErrUnknownKey, not a crash.
	if _, err := old.Decrypt(FieldName, envNew); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("unknown key id: err = %v, want ErrUnknownKey", err)
	}
}

func make32() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return b
}

func TestParseKeyring(t *testing.T) {
	t.Parallel()
	keys, blind, err := GenerateSpec("demo")
	if err != nil {
		t.Fatal(err)
	}
	keys2, _, _ := GenerateSpec("old")
	kr, err := ParseKeyring(keys+","+keys2, blind)
	if err != nil {
		t.Fatal(err)
	}
	if kr.PrimaryKeyID() != "demo" {
		t.Fatalf("primary = %q", kr.PrimaryKeyID())
	}
	secret := strings.SplitN(keys, ":", 2)[1]
	for _, bad := range []string{"", "nocolon", "k1:not-base64!!", "k1:" + "AAAA", keys + "," + keys, "bad id:" + secret} {
		_, err := ParseKeyring(bad, blind)
		if !errors.Is(err, ErrBadKeyring) {
			t.Errorf("ParseKeyring(%q): err = %v, want ErrBadKeyring", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("error message leaks key material: %v", err)
		}
	}
	if _, err := ParseKeyring(keys, "c2hvcnQ="); !errors.Is(err, ErrBadKeyring) {
		t.Errorf("short blind key: err = %v", err)
	}
}

func TestBlindIndexNormalisesEmail(t *testing.T) {
	t.Parallel()
	kr, _ := newRing(t, "k1")
	a := kr.BlindIndex(FieldEmail, " Ayse@Example.COM ")
	b := kr.BlindIndex(FieldEmail, "ayse@example.com")
	c := kr.BlindIndex(FieldEmail, "ayse@example.org")
	if string(a) != string(b) {
		t.Fatal("blind index differs for the same email in another case")
	}
	if string(a) == string(c) {
		t.Fatal("blind index equal for different emails")
	}
	other, _ := newRing(t, "k1")
	if string(other.BlindIndex(FieldEmail, "ayse@example.com")) == string(b) {
		t.Fatal("blind index does not depend on the key")
	}
}

func TestMaskExamples(t *testing.T) {
	t.Parallel()
	cases := []struct{ field, in, want string }{
		{FieldName, "Ahmet Yılmaz", "A*** Y***"},
		{FieldName, "ayşe", "a***"},
		{FieldEmail, "ahmet@example.com", "a***@e***.com"},
		{FieldEmail, "not-an-email", Masked},
		{FieldTaxID, "12345678901", "*******8901"},
		{FieldTaxID, "1234", "*******"},
		{"iban", "TR330006100519786457841326", Masked},
		{"whatever", "x", Masked},
	}
	for _, c := range cases {
		if got := Mask(c.field, c.in); got != c.want {
			t.Errorf("Mask(%q, %q) = %q, want %q", c.field, c.in, got, c.want)
		}
	}
	if Show("amount", "10.00") != "10.00" || Show("email", "a@b.com") == "a@b.com" || Show("new_field", "secret") != Masked {
		t.Error("field policy is not default-deny")
	}
}

func alnumCount(s string) int {
	n := 0
	for _, r := range s {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			n++
		}
	}
	return n
}

// FuzzMask: the masker never panics and never echoes its input.
func FuzzMask(f *testing.F) {
	for _, s := range []string{"Ahmet Yılmaz", "a@b.co", "12345678901", "", "***", "a", "@", "x@y", "ab@cd.com", "\xff\xfe"} {
		for _, fld := range []string{FieldName, FieldEmail, FieldTaxID, "other"} {
			f.Add(fld, s)
		}
	}
	f.Fuzz(func(t *testing.T, field, value string) {
		out := Mask(field, value)
		if alnumCount(value) >= 2 && strings.Contains(out, strings.TrimSpace(value)) {
			t.Fatalf("Mask(%q, %q) = %q echoes its input", field, value, out)
		}
		if alnumCount(value) >= 1 && out == value {
			t.Fatalf("Mask(%q, %q) returned its input", field, value)
		}
	})
}

func FuzzDecrypt(f *testing.F) {
	kr, _ := newRing(f, "k1")
	env, _ := kr.Encrypt(FieldName, "x")
	f.Add(env)
	f.Add("enc:v1:k1:")
	f.Add("enc:v1::AAAA")
	f.Fuzz(func(t *testing.T, v string) {
		_, _ = kr.Decrypt(FieldName, v) // must not panic
	})
}
