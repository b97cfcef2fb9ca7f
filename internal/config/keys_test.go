package config

import (
	"io"
	"strings"
	"testing"
)

// Well-formed test keys (32 zero bytes, base64): the checks parse the
// keyring, so a placeholder would fail before the setting under test.
const (
	testPIIKeys  = "k1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
	testBlindKey = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
)

func TestConsoleKeysAreOptionalButWhole(t *testing.T) {
	t.Parallel()
	parse := func(env map[string]string) (*Console, error) {
		var c Console
		f := NewFlags("serve", "", MapLookup(env), io.Discard)
		c.Register(f)
		if err := f.Parse(nil); err != nil {
			return nil, err
		}
		return &c, c.Validate()
	}
	base := map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1/db", "OIDC_ISSUER": "http://127.0.0.1:9/", "OIDC_CLIENT_ID": "c", "OIDC_CLIENT_SECRET": "s", "CONSOLE_ROLE_MAP": "g:viewer"}
	c, err := parse(base)
	if err != nil || c.Keyring != nil {
		t.Fatalf("without keys: %v, keyring %v; want a console that reveals nothing", err, c)
	}
	half := map[string]string{"PII_KEYS": testPIIKeys}
	for k, v := range base {
		half[k] = v
	}
	if _, err := parse(half); err == nil || !strings.Contains(err.Error(), "PII_BLIND_INDEX_KEY") {
		t.Fatalf("PII_KEYS without PII_BLIND_INDEX_KEY: %v, want an error naming it", err)
	}
	half["PII_BLIND_INDEX_KEY"] = testBlindKey
	if c, err := parse(half); err != nil || c.Keyring == nil {
		t.Fatalf("with both keys: %v", err)
	}
}
