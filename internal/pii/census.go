package pii

import (
	"errors"
	"fmt"
	"sort"
)

// KeyVersion names the key and envelope format of a value.
type KeyVersion struct{ KeyID, Version string }

// Census counts sealed values for `console pii check`: an operator retires
// an old key once no value opens under it and nothing is undecryptable.
type Census struct {
	// Values counts the values that open, by key id and envelope version.
	Values map[KeyVersion]int
	// UnknownKey counts values under key ids the ring does not hold.
	UnknownKey map[string]int
	// Broken counts values that do not open under a key the ring holds
	// (tampered, moved from another place) or are not envelopes at all.
	Broken int
	// Stale counts the values that open but are not current (another key,
	// or v1): what `console pii rotate` rewrites.
	Stale int
}

// Add opens one value of a record and counts it.
func (c *Census) Add(kr *Keyring, place Place, field, envelope string) {
	_, err := kr.Open(place, field, envelope)
	c.add(kr, envelope, err)
}

func (c *Census) add(kr *Keyring, envelope string, openErr error) {
	e, perr := parseEnvelope(envelope)
	switch {
	case perr != nil:
		c.Broken++
	case errors.Is(openErr, ErrUnknownKey):
		if c.UnknownKey == nil {
			c.UnknownKey = map[string]int{}
		}
		c.UnknownKey[e.kid]++
	case openErr != nil:
		c.Broken++
	default:
		if c.Values == nil {
			c.Values = map[KeyVersion]int{}
		}
		c.Values[KeyVersion{e.kid, e.version}]++
		if !kr.Current(envelope) {
			c.Stale++
		}
	}
}

// Merge adds o's counts to c.
func (c *Census) Merge(o Census) {
	for kv, n := range o.Values {
		if c.Values == nil {
			c.Values = map[KeyVersion]int{}
		}
		c.Values[kv] += n
	}
	for k, n := range o.UnknownKey {
		if c.UnknownKey == nil {
			c.UnknownKey = map[string]int{}
		}
		c.UnknownKey[k] += n
	}
	c.Broken += o.Broken
	c.Stale += o.Stale
}

// Undecryptable is how many values do not open with this ring.
func (c Census) Undecryptable() int {
	n := c.Broken
	for _, u := range c.UnknownKey {
		n += u
	}
	return n
}

// Lines is the census as text, one count per line, in a stable order.
func (c Census) Lines() []string {
	kvs := make([]KeyVersion, 0, len(c.Values))
	for kv := range c.Values {
		kvs = append(kvs, kv)
	}
	sort.Slice(kvs, func(i, j int) bool {
		if kvs[i].KeyID != kvs[j].KeyID {
			return kvs[i].KeyID < kvs[j].KeyID
		}
		return kvs[i].Version < kvs[j].Version
	})
	var out []string
	for _, kv := range kvs {
		out = append(out, fmt.Sprintf("key %s %s: %d", kv.KeyID, kv.Version, c.Values[kv]))
	}
	unknown := make([]string, 0, len(c.UnknownKey))
	for k := range c.UnknownKey {
		unknown = append(unknown, k)
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		out = append(out, fmt.Sprintf("key %s (not in PII_KEYS): %d undecryptable", k, c.UnknownKey[k]))
	}
	if c.Broken > 0 {
		out = append(out, fmt.Sprintf("tampered or misplaced: %d undecryptable", c.Broken))
	}
	return out
}
