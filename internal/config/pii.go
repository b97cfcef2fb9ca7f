package config

import (
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/pii"
)

// defaultPIIBatch is how many rows `console pii rotate` rewrites per
// transaction: short transactions, few row locks held at once.
const defaultPIIBatch = 500

// PII configures `console pii rotate|check`: the keyring (PII_KEYS, the
// first key encrypts; PII_BLIND_INDEX_KEY) and the database whose payment
// customers and outbox payloads are rotated or counted.
type PII struct {
	DatabaseURL string
	PIIKeys
	Batch  int
	DryRun bool
}

// PIIKeys is the personal-data keyring: PII_KEYS (the first key encrypts,
// all decrypt) and PII_BLIND_INDEX_KEY. Keyring is parsed by the
// subcommand's Validate; messages never carry key material.
type PIIKeys struct {
	Keys          string
	BlindIndexKey string
	Keyring       *pii.Keyring
}

func (k *PIIKeys) register(f *Flags) {
	f.String(&k.Keys, "pii-keys", "PII_KEYS", "", "keyring id:base64key,...; the first encrypts, all decrypt")
	f.String(&k.BlindIndexKey, "pii-blind-index-key", "PII_BLIND_INDEX_KEY", "", "base64 HMAC key (≥ 32 bytes) for blind indexes")
}

// check parses the keyring. required: both settings must be there;
// otherwise both or neither (a console without keys reveals nothing).
func (k *PIIKeys) check(ck *Check, required bool) {
	if required || k.Keys != "" || k.BlindIndexKey != "" {
		ck.Required("PII_KEYS", k.Keys)
		ck.Required("PII_BLIND_INDEX_KEY", k.BlindIndexKey)
	}
	if k.Keys != "" && k.BlindIndexKey != "" {
		kr, err := pii.ParseKeyring(k.Keys, k.BlindIndexKey)
		if err != nil {
			ck.Add(err)
		}
		k.Keyring = kr
	}
}

// Register adds the flags. --dry-run is per invocation: no environment twin.
func (c *PII) Register(f *Flags) {
	registerDatabaseURL(f, &c.DatabaseURL, "PostgreSQL ≥ 15 connection URL")
	c.PIIKeys.register(f)
	f.Int(&c.Batch, "batch", "PII_ROTATE_BATCH", defaultPIIBatch, "rows per transaction")
	f.Bool(&c.DryRun, "dry-run", "", false, "rotate: count what would be rewritten and change nothing")
}

// Validate checks the settings and parses the keyring; messages name the
// variable and never carry key material.
func (c *PII) Validate() error {
	var ck Check
	ck.DatabaseURL("DATABASE_URL", c.DatabaseURL)
	c.PIIKeys.check(&ck, true)
	if c.Batch < 1 || c.Batch > db.MaxDeleteBatch {
		ck.Failf("PII_ROTATE_BATCH must be between 1 and %d (got %d)", db.MaxDeleteBatch, c.Batch)
	}
	return ck.Err()
}

// PIIKeygen configures `console pii keygen`: no database, no keys.
type PIIKeygen struct {
	KeyID string
}

// Register adds the flag.
func (c *PIIKeygen) Register(f *Flags) {
	f.String(&c.KeyID, "id", "", "", "the new key's id (1–32 letters, digits, '-' or '_'; default k<today>, e.g. k20260301)")
}

// Validate has nothing to check: GenerateKey checks the id.
func (c *PIIKeygen) Validate() error { return nil }
