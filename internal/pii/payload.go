package pii

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Event payloads are sealed field by field before the outbox row is written:
// the fields the event type's schema declares Safe stay in clear (routing,
// observability), every other field becomes a v2 envelope bound to
// (event type, event id, path). The plaintext of a payload envelope is the
// JSON text of the value, so any value (a string, a number, an address
// object) comes back exactly as it was.
//
// Legacy payloads written before v2 carry the payment row's v1 envelopes,
// whose plaintext is the bare string and whose field is the path's last key
// ("email" for customer.email); they open until rotation rewrites them.

// Errors of the payload functions.
var (
	// ErrNoSchema: SealPayload refuses an event type the schema does not
	// declare, rather than guessing which of its fields are personal.
	ErrNoSchema = errors.New("pii: no field schema for this event type (declare it in internal/pii/schema.go)")
	// ErrNoKeyring: a payload has a field to seal and no keyring was given.
	ErrNoKeyring = errors.New("pii: a field must be sealed and there is no keyring")
	// ErrPayload: the payload is not a JSON object.
	ErrPayload = errors.New("pii: payload is not a JSON object")
)

// SealPayload seals every field of payload the schema of eventType does not
// declare Safe, for the event eventID. Values already sealed for this event
// stay as they are, so sealing twice changes nothing. kr may be nil for a
// payload that carries only Safe fields (events without personal data);
// anything to seal then fails with ErrNoKeyring.
func SealPayload(kr *Keyring, eventType, eventID string, payload []byte) ([]byte, error) {
	schema, ok := eventSchemas[eventType]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNoSchema, eventType)
	}
	obj, err := decodeObject(payload)
	if err != nil {
		return nil, err
	}
	place := Place{Kind: eventType, ID: eventID}
	err = eachSensitive(schema, obj, "", func(obj map[string]any, k, path string, _ Rule, _ bool) error {
		if kr == nil {
			return fmt.Errorf("%w: %s of %s", ErrNoKeyring, path, eventType)
		}
		if s, isStr := obj[k].(string); isStr && IsEnvelope(s) {
			if _, err := kr.openPayloadValue(place, path, s); err != nil {
				return fmt.Errorf("pii: %s of %s is an envelope that does not open for this event: %w", path, eventType, err)
			}
			return nil
		}
		text, err := encode(obj[k], false)
		if err != nil {
			return fmt.Errorf("pii: encode %s of %s: %w", path, eventType, err)
		}
		if obj[k], err = kr.Seal(place, path, string(text)); err != nil {
			return fmt.Errorf("pii: seal %s of %s: %w", path, eventType, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return encode(obj, false)
}

// OpenPayload is SealPayload's inverse: every envelope in payload opened in
// place. A consumer that needs one field should use OpenPayloadField.
func OpenPayload(kr *Keyring, eventType, eventID string, payload []byte) ([]byte, error) {
	obj, err := decodeObject(payload)
	if err != nil {
		return nil, err
	}
	place := Place{Kind: eventType, ID: eventID}
	err = walkEnvelopes(eventSchemas[eventType], obj, "", func(path, env string) (any, error) {
		text, err := kr.openPayloadValue(place, path, env)
		if err != nil {
			return nil, fmt.Errorf("pii: open %s of %s %s: %w", path, eventType, eventID, err)
		}
		return decodeValue(text)
	})
	if err != nil {
		return nil, err
	}
	return encode(obj, false)
}

// OpenPayloadField returns the clear JSON value at path ("customer.email")
// of a payload, opening it when it is sealed; only that one field is
// decrypted. A missing path is an error.
func OpenPayloadField(kr *Keyring, eventType, eventID string, payload []byte, path string) (json.RawMessage, error) {
	obj, err := decodeObject(payload)
	if err != nil {
		return nil, err
	}
	var v any = obj
	for _, k := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("pii: %s has no field %s", eventType, path)
		}
		if v, ok = m[k]; !ok {
			return nil, fmt.Errorf("pii: %s has no field %s", eventType, path)
		}
	}
	if s, ok := v.(string); ok && IsEnvelope(s) {
		text, err := kr.openPayloadValue(Place{Kind: eventType, ID: eventID}, path, s)
		if err != nil {
			return nil, fmt.Errorf("pii: open %s of %s %s: %w", path, eventType, eventID, err)
		}
		return json.RawMessage(text), nil
	}
	return encode(v, false)
}

// MaskPayload is what a screen shows of a payload without opening anything:
// Safe fields in clear, declared sensitive fields masked by their rule (or
// Encrypted when sealed), undeclared fields redacted. An event type
// without a schema shows only its keys ({"a":"[redacted]",…}).
func MaskPayload(eventType string, payload []byte) []byte {
	return maskPayload(eventType, payload, nil)
}

// MaskSealedPayload is MaskPayload with the keys: sealed fields are opened
// and masked by their rule ("A*** Y***"); a value that does not open shows
// as Undecryptable, and never fails the page.
func (kr *Keyring) MaskSealedPayload(eventType, eventID string, payload []byte) []byte {
	place := Place{Kind: eventType, ID: eventID}
	return maskPayload(eventType, payload, func(path, env string) ([]byte, error) {
		return kr.openPayloadValue(place, path, env)
	})
}

func maskPayload(eventType string, payload []byte, open func(path, env string) ([]byte, error)) []byte {
	var whole any
	if err := json.Unmarshal(payload, &whole); err != nil {
		return []byte(`"` + Redacted + `"`)
	}
	schema, ok := eventSchemas[eventType]
	obj, isObj := whole.(map[string]any)
	if !ok || !isObj {
		out, _ := encode(redactKeys(whole), true)
		return out
	}
	_ = eachSensitive(schema, obj, "", func(obj map[string]any, k, path string, rule Rule, declared bool) error {
		if !declared {
			obj[k] = Redacted
			return nil
		}
		obj[k] = maskValue(rule, path, obj[k], open)
		return nil
	})
	out, _ := encode(obj, true)
	return out
}

// maskValue masks one declared sensitive value, opening it first when it
// is sealed and the keys are at hand.
func maskValue(rule Rule, path string, v any, open func(path, env string) ([]byte, error)) any {
	if s, ok := v.(string); ok && IsEnvelope(s) {
		if open == nil {
			return Encrypted
		}
		text, err := open(path, s)
		if err != nil {
			return Undecryptable
		}
		if v, err = decodeValue(text); err != nil {
			return Undecryptable
		}
	}
	if s, ok := v.(string); ok {
		return Mask(rule, s)
	}
	return Redacted
}

// eachSensitive calls fn for every field of obj, looking into objects the
// schema does not declare, that is neither Safe nor null: the fields the
// sealer seals and the masker masks. fn may replace obj[k].
func eachSensitive(schema Schema, obj map[string]any, prefix string, fn func(obj map[string]any, k, path string, rule Rule, declared bool) error) error {
	for k, v := range obj {
		path := join(prefix, k)
		rule, declared := schema[path]
		if rule == Safe || v == nil {
			continue
		}
		if sub, isObj := v.(map[string]any); isObj && !declared {
			if err := eachSensitive(schema, sub, path, fn); err != nil {
				return err
			}
			continue
		}
		if err := fn(obj, k, path, rule, declared); err != nil {
			return err
		}
	}
	return nil
}

// redactKeys keeps the shape of keys and nothing else.
func redactKeys(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, sub := range t {
			t[k] = redactKeys(sub)
		}
		return t
	case []any:
		for i, sub := range t {
			t[i] = redactKeys(sub)
		}
		return t
	case nil:
		return nil
	}
	return Redacted
}

// ResealPayload rewrites every envelope of payload that is not current
// (another key, or v1) as a v2 envelope under the primary key, for
// rotation. It returns the new payload (nil when nothing changed) and
// counts; a value that does not open is left exactly as it was and counted
// in failed, never dropped.
func (kr *Keyring) ResealPayload(eventType, eventID string, payload []byte) (out []byte, rewritten, failed int, err error) {
	obj, err := decodeObject(payload)
	if err != nil {
		return nil, 0, 0, err
	}
	place := Place{Kind: eventType, ID: eventID}
	err = walkEnvelopes(eventSchemas[eventType], obj, "", func(path, env string) (any, error) {
		if kr.Current(env) {
			return env, nil
		}
		text, err := kr.openPayloadValue(place, path, env)
		if err != nil {
			failed++
			return env, nil
		}
		sealed, err := kr.Seal(place, path, string(text))
		if err != nil {
			return nil, fmt.Errorf("pii: seal %s of %s %s: %w", path, eventType, eventID, err)
		}
		rewritten++
		return sealed, nil
	})
	if err != nil || rewritten == 0 {
		return nil, 0, failed, err
	}
	out, err = encode(obj, false)
	return out, rewritten, failed, err
}

// CensusPayload adds every envelope of payload to c (see Census).
func (kr *Keyring) CensusPayload(c *Census, eventType, eventID string, payload []byte) {
	obj, err := decodeObject(payload)
	if err != nil {
		return
	}
	place := Place{Kind: eventType, ID: eventID}
	_ = walkEnvelopes(eventSchemas[eventType], obj, "", func(path, env string) (any, error) {
		_, err := kr.openPayloadValue(place, path, env)
		c.add(kr, env, err)
		return env, nil
	})
}

// openPayloadValue opens one payload envelope and returns the value's JSON
// text: v2 binds the full path and holds JSON; v1 bound the last key and
// held a bare string.
func (kr *Keyring) openPayloadValue(place Place, path, env string) ([]byte, error) {
	if strings.HasPrefix(env, envelopeV1) {
		clear, err := kr.Open(place, path[strings.LastIndexByte(path, '.')+1:], env)
		if err != nil {
			return nil, err
		}
		return json.Marshal(clear)
	}
	clear, err := kr.Open(place, path, env)
	if err != nil {
		return nil, err
	}
	if !json.Valid([]byte(clear)) {
		return nil, ErrMalformed
	}
	return []byte(clear), nil
}

// walkEnvelopes calls fn for every envelope string inside objects of v, in
// a fixed order (sorted keys), and stores what fn returns in its place.
// Fields the schema declares Safe are data, even when they look like an
// envelope; envelopes inside arrays are left alone: the sealer never writes
// them.
func walkEnvelopes(schema Schema, obj map[string]any, prefix string, fn func(path, env string) (any, error)) error {
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		path := join(prefix, k)
		if schema[path] == Safe {
			continue
		}
		switch t := obj[k].(type) {
		case map[string]any:
			if err := walkEnvelopes(schema, t, path, fn); err != nil {
				return err
			}
		case string:
			if IsEnvelope(t) {
				v, err := fn(path, t)
				if err != nil {
					return err
				}
				obj[k] = v
			}
		}
	}
	return nil
}

func join(prefix, k string) string {
	if prefix == "" {
		return k
	}
	return prefix + "." + k
}

func decodeObject(payload []byte) (map[string]any, error) {
	v, err := decodeValue(payload)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrPayload, err)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, ErrPayload
	}
	return obj, nil
}

// decodeValue decodes one JSON value, numbers kept as written.
func decodeValue(text []byte) (any, error) {
	if !json.Valid(text) {
		return nil, errors.New("not valid JSON")
	}
	d := json.NewDecoder(bytes.NewReader(text))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, errors.New("trailing data after the JSON value")
	}
	return v, nil
}

// encode writes v as compact JSON. Stored payloads keep <, > and & as they
// are; display output escapes them as a second line of defence.
func encode(v any, escapeHTML bool) ([]byte, error) {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(escapeHTML)
	if err := e.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// PayloadMarkers are what the JSON text of a payload contains when it holds
// sealed values: every envelope starts with anyEnvelope, a current one (v2
// under the primary key) with current. Storage selects the payloads a
// rotation must visit with them (outbox.PayloadMatch) without parsing JSON.
func (kr *Keyring) PayloadMarkers() (anyEnvelope, current string) {
	return `"enc:v`, `"` + envelopeV2 + kr.primary + ":"
}

// SealedFields lists the paths of the sealed values in a payload (sorted),
// for a screen that offers to reveal them one at a time. A payload that is
// not a JSON object has none.
func SealedFields(eventType string, payload []byte) []string {
	obj, err := decodeObject(payload)
	if err != nil {
		return nil
	}
	schema, _ := EventSchema(eventType)
	var paths []string
	_ = walkEnvelopes(schema, obj, "", func(path, env string) (any, error) {
		paths = append(paths, path)
		return env, nil
	})
	return paths
}
