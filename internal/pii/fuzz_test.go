package pii_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode"

	"github.com/sluice-dev/sluice/internal/pii"
)

func alnumCount(s string) int {
	n := 0
	for _, r := range s {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			n++
		}
	}
	return n
}

var sensitiveRules = []pii.Rule{pii.Name, pii.Email, pii.TaxID, pii.Phone, pii.Address, pii.FreeText, 0}

// FuzzMask: no masker panics or echoes its input, alone or through
// MaskRecord and MaskPayload.
func FuzzMask(f *testing.F) {
	for _, s := range []string{"Ahmet Yılmaz", "a@b.co", "12345678901", "", "***", "a", "@", "x@y", "ab@cd.com", "\xff\xfe", "*******EF", "+90 532 123 45 67", "ac", "redacted", "encrypted"} {
		for i := range sensitiveRules {
			f.Add(uint8(i), s)
		}
	}
	f.Fuzz(func(t *testing.T, ruleIndex uint8, value string) {
		rule := sensitiveRules[int(ruleIndex)%len(sensitiveRules)]
		echoes := func(out string) bool {
			switch out {
			case pii.Redacted, pii.Encrypted, pii.Masked, pii.Undecryptable:
				// A fixed placeholder says nothing of the input, even
				// when the input happens to be part of it ("ac" in
				// "[redacted]").
				return false
			}
			// An input with one letter or digit can equal its mask ("A***"
			// masks a name to its initial and stars, so it masks to itself):
			// the mask shows that one character by design, nothing more.
			v := strings.TrimSpace(value)
			return alnumCount(value) >= 2 && (strings.Contains(out, v) || out == value)
		}
		if out := pii.Mask(rule, value); echoes(out) {
			t.Fatalf("Mask(%v, %q) = %q echoes its input", rule, value, out)
		}
		for f := range map[string]bool{pii.FieldName: true, pii.FieldEmail: true, pii.FieldTaxID: true, "undeclared": true} {
			if out := pii.MaskRecord("payment", map[string]string{f: value})[f]; echoes(out) && value != pii.Undecryptable {
				t.Fatalf("MaskRecord(%s=%q) = %q echoes its input", f, value, out)
			}
		}
		quoted, _ := json.Marshal(value)
		for _, p := range []string{`{"customer":{"name":` + string(quoted) + `}}`, `{"note":` + string(quoted) + `}`, `{"x":` + string(quoted) + `}`} {
			out := pii.MaskPayload("order.placed.v1", []byte(p))
			if alnumCount(value) >= 2 && strings.Contains(string(out), string(quoted)) {
				t.Fatalf("MaskPayload(%s) = %s echoes its input", p, out)
			}
		}
	})
}

// FuzzSealPayload: whatever the payload, a sealed one round-trips to the
// same JSON and leaves no field the schema does not declare Safe in clear.
func FuzzSealPayload(f *testing.F) {
	kr, _ := ring(f, "k1")
	f.Add(orderPayload)
	f.Add(`{"operation_id":"x","customer":{"name":"A","email":"a@b.c","tax_id":"1"},"amount":"1.00"}`)
	f.Add(`{"customer":"flat","customer.name":"dotted","note":{"deep":[1,{"x":"y"}]},"order_id":1e400}`)
	f.Add(`{"order_id":"enc:v2:k1:AAAA","note":"enc:v1:k1:AAAA"}`)
	f.Add(`{}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, payload string) {
		for _, eventType := range []string{"order.placed.v1", "payment.requested.v1"} {
			sealed, err := pii.SealPayload(kr, eventType, "ev", []byte(payload))
			if err != nil {
				continue
			}
			opened, err := pii.OpenPayload(kr, eventType, "ev", sealed)
			if err != nil {
				t.Fatalf("sealed payload does not open: %v\n%s", err, sealed)
			}
			if !jsonEqual(t, opened, []byte(payload)) {
				t.Fatalf("round trip changed the payload:\n%s\n%s", payload, opened)
			}
			schema, _ := pii.EventSchema(eventType)
			var obj map[string]any
			d := json.NewDecoder(bytes.NewReader(sealed))
			d.UseNumber()
			if err := d.Decode(&obj); err != nil {
				t.Fatalf("sealed payload is not JSON: %v", err)
			}
			if path, ok := clearField(schema, obj, ""); !ok {
				t.Fatalf("%s left in clear: %s", path, sealed)
			}
		}
	})
}

// clearField finds a field that is neither Safe, null, an object to look
// into, nor an envelope.
func clearField(schema pii.Schema, obj map[string]any, prefix string) (string, bool) {
	for k, v := range obj {
		path := k
		if prefix != "" {
			path = prefix + "." + k
		}
		rule, declared := schema[path]
		if rule == pii.Safe || v == nil {
			continue
		}
		if sub, isObj := v.(map[string]any); isObj && !declared {
			if p, ok := clearField(schema, sub, path); !ok {
				return p, false
			}
			continue
		}
		if s, isStr := v.(string); !isStr || !pii.IsEnvelope(s) {
			return path, false
		}
	}
	return "", true
}

// FuzzOpen: the envelope parser never panics, and an envelope with any bit
// flipped never opens.
func FuzzOpen(f *testing.F) {
	kr, _ := ring(f, "k1")
	place := pii.Place{Kind: "payment", ID: "p1"}
	env, err := kr.Seal(place, pii.FieldName, "Ayşe Yılmaz")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(env, uint(0), byte(1))
	f.Add("enc:v1:k1:", uint(3), byte(0x80))
	f.Add("enc:v2::AAAA", uint(7), byte(2))
	f.Add("enc:v2:k1:!!!", uint(1), byte(4))
	f.Fuzz(func(t *testing.T, s string, at uint, bit byte) {
		_, _ = kr.Open(place, pii.FieldName, s) // must not panic
		_, _ = pii.KeyID(s)
		_, _ = pii.Version(s)
		var c pii.Census
		c.Add(kr, place, pii.FieldName, s)
		if bit == 0 {
			return
		}
		bad := tamper(t, env, int(at%(1<<20)), bit)
		if _, err := kr.Open(place, pii.FieldName, bad); !errors.Is(err, pii.ErrMalformed) {
			t.Fatalf("tampered envelope (byte %d ^ %#x): err = %v", at, bit, err)
		}
	})
}
