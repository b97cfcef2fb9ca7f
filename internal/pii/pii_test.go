package pii_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/pii"
	"github.com/sluice-dev/sluice/internal/pii/piitest"
)

func ring(t testing.TB, ids ...string) (*pii.Keyring, []pii.Key) {
	t.Helper()
	var keys []pii.Key
	for _, id := range ids {
		keys = append(keys, piitest.Key(t, id))
	}
	return piitest.Ring(t, piitest.Bytes(t, 32), keys...), keys
}

var pay1 = pii.Place{Kind: "payment", ID: "0190a000-0000-7000-8000-000000000001"}

// tamper flips one bit of the sealed bytes at i (mod their length).
func tamper(t testing.TB, env string, i int, bit byte) string {
	t.Helper()
	cut := strings.LastIndexByte(env, ':')
	raw, err := base64.RawURLEncoding.DecodeString(env[cut+1:])
	if err != nil || len(raw) == 0 {
		t.Fatalf("not an envelope: %q", env)
	}
	raw[i%len(raw)] ^= bit
	return env[:cut+1] + base64.RawURLEncoding.EncodeToString(raw)
}

func TestSealRoundTripAndPlaceBinding(t *testing.T) {
	t.Parallel()
	kr, _ := ring(t, "k1")
	env, err := kr.Seal(pay1, pii.FieldEmail, "ayse@example.com")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(env, "enc:v2:k1:") || strings.Contains(env, "ayse@") {
		t.Fatalf("envelope %q: want enc:v2:k1: prefix and no clear text", env)
	}
	if got, err := kr.Open(pay1, pii.FieldEmail, env); err != nil || got != "ayse@example.com" {
		t.Fatalf("Open = %q, %v", got, err)
	}
	moved := map[string]struct {
		place pii.Place
		field string
	}{
		"another row":         {pii.Place{Kind: "payment", ID: "0190a000-0000-7000-8000-000000000002"}, pii.FieldEmail},
		"another field":       {pay1, pii.FieldName},
		"another event type":  {pii.Place{Kind: "payment.requested.v1", ID: pay1.ID}, pii.FieldEmail},
		"kind and id shifted": {pii.Place{Kind: "paymen", ID: "t" + pay1.ID}, pii.FieldEmail},
	}
	for name, m := range moved {
		if _, err := kr.Open(m.place, m.field, env); !errors.Is(err, pii.ErrMalformed) {
			t.Errorf("ciphertext moved to %s: err = %v, want ErrMalformed", name, err)
		}
	}
	for i := range 3 {
		bad := tamper(t, env, i*13, 1<<i)
		if _, err := kr.Open(pay1, pii.FieldEmail, bad); !errors.Is(err, pii.ErrMalformed) {
			t.Fatalf("one flipped bit at %d: err = %v, want ErrMalformed", i*13, err)
		}
	}
	env2, _ := kr.Seal(pay1, pii.FieldEmail, "ayse@example.com")
	if env2 == env {
		t.Fatal("two encryptions of one value are equal: nonce reuse")
	}
	if v, _ := pii.Version(env); v != pii.V2 {
		t.Fatalf("Version = %q", v)
	}
}

// v1 values (written before places were bound) keep opening, with the field
// alone, until rotation rewrites them as v2 under the primary key.
func TestV1StillOpensUntilResealed(t *testing.T) {
	t.Parallel()
	kr, keys := ring(t, "k1")
	v1 := piitest.SealV1(t, keys[0], pii.FieldName, "Ayşe Yılmaz")
	if got, err := kr.Open(pay1, pii.FieldName, v1); err != nil || got != "Ayşe Yılmaz" {
		t.Fatalf("v1 Open = %q, %v", got, err)
	}
	if _, err := kr.Open(pay1, pii.FieldEmail, v1); !errors.Is(err, pii.ErrMalformed) {
		t.Fatalf("v1 moved to another field: %v", err)
	}
	if kr.Current(v1) {
		t.Fatal("a v1 value counts as current")
	}
	v2, changed, err := kr.Reseal(pay1, pii.FieldName, v1)
	if err != nil || !changed || !kr.Current(v2) {
		t.Fatalf("Reseal = %q, %v, %v", v2, changed, err)
	}
	if got, err := kr.Open(pay1, pii.FieldName, v2); err != nil || got != "Ayşe Yılmaz" {
		t.Fatalf("resealed Open = %q, %v", got, err)
	}
	if same, changed, err := kr.Reseal(pay1, pii.FieldName, v2); err != nil || changed || same != v2 {
		t.Fatalf("Reseal of a current value: %v %v", changed, err)
	}
}

// Keys rotate without migrating data: a ring whose primary is the new key
// still opens values written under the old one, and writes under the new
// one; a ring without the key reports ErrUnknownKey and screens show
// Undecryptable, without a panic.
func TestOldKeyStillDecryptsUnknownKeyUndecryptable(t *testing.T) {
	t.Parallel()
	blind := piitest.Bytes(t, 32)
	oldKey, newKey := piitest.Key(t, "2025a"), piitest.Key(t, "2026a")
	old := piitest.Ring(t, blind, oldKey)
	rotated := piitest.Ring(t, blind, newKey, oldKey)
	envOld, _ := old.Seal(pay1, pii.FieldName, "Ayşe Yılmaz")
	if got, err := rotated.Open(pay1, pii.FieldName, envOld); err != nil || got != "Ayşe Yılmaz" {
		t.Fatalf("old value after rotation: %q, %v", got, err)
	}
	envNew, _ := rotated.Seal(pay1, pii.FieldName, "Ayşe Yılmaz")
	if kid, _ := pii.KeyID(envNew); kid != "2026a" {
		t.Fatalf("new values written under %q, want the primary 2026a", kid)
	}
	if _, err := old.Open(pay1, pii.FieldName, envNew); !errors.Is(err, pii.ErrUnknownKey) {
		t.Fatalf("unknown key id: err = %v, want ErrUnknownKey", err)
	}
	shown := pii.MaskRecord("payment", map[string]string{pii.FieldName: pii.Undecryptable})
	if shown[pii.FieldName] != pii.Undecryptable {
		t.Fatalf("MaskRecord of an undecryptable value = %q", shown[pii.FieldName])
	}
	payload, err := pii.SealPayload(rotated, "order.placed.v1", "e1", []byte(`{"order_id":1,"customer":{"name":"Ayşe Yılmaz"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(old.MaskSealedPayload("order.placed.v1", "e1", payload)); !strings.Contains(got, `"name":"undecryptable"`) || !strings.Contains(got, `"order_id":1`) {
		t.Fatalf("payload under an unknown key shows %s", got)
	}
}

func TestParseKeyringAndKeygen(t *testing.T) {
	t.Parallel()
	keys, blind, err := pii.GenerateSpec("demo")
	if err != nil {
		t.Fatal(err)
	}
	keys2, err := pii.GenerateKey("old")
	if err != nil || !strings.HasPrefix(keys2, "old:") {
		t.Fatalf("GenerateKey = %q, %v", keys2, err)
	}
	kr, err := pii.ParseKeyring(keys+","+keys2, blind)
	if err != nil {
		t.Fatal(err)
	}
	if kr.PrimaryKeyID() != "demo" || strings.Join(kr.KeyIDs(), ",") != "demo,old" {
		t.Fatalf("primary = %q, ids %v", kr.PrimaryKeyID(), kr.KeyIDs())
	}
	if _, err := pii.GenerateKey("bad id"); !errors.Is(err, pii.ErrBadKeyring) {
		t.Fatalf("GenerateKey(bad id): %v", err)
	}
	secret := strings.SplitN(keys, ":", 2)[1]
	for _, bad := range []string{"", "nocolon", "k1:not-base64!!", "k1:" + "AAAA", keys + "," + keys, "bad id:" + secret} {
		_, err := pii.ParseKeyring(bad, blind)
		if !errors.Is(err, pii.ErrBadKeyring) {
			t.Errorf("ParseKeyring(%q): err = %v, want ErrBadKeyring", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("error message leaks key material: %v", err)
		}
	}
	if _, err := pii.ParseKeyring(keys, "c2hvcnQ="); !errors.Is(err, pii.ErrBadKeyring) {
		t.Errorf("short blind key: err = %v", err)
	}
}

func TestBlindIndexAndSearchHash(t *testing.T) {
	t.Parallel()
	kr, _ := ring(t, "k1")
	same := func(a, b []byte) bool { return string(a) == string(b) }
	if !same(kr.BlindIndex(pii.FieldEmail, " Ayse@Example.COM "), kr.BlindIndex(pii.FieldEmail, "ayse@example.com")) {
		t.Fatal("blind index differs for the same email in another case")
	}
	if same(kr.BlindIndex(pii.FieldEmail, "ayse@example.com"), kr.BlindIndex(pii.FieldEmail, "ayse@example.org")) {
		t.Fatal("blind index equal for different emails")
	}
	if !same(kr.BlindIndex(pii.FieldTaxID, "123 456-789.01"), kr.BlindIndex(pii.FieldTaxID, "12345678901")) {
		t.Fatal("blind index of a tax id depends on spaces, dashes or dots")
	}
	if same(kr.BlindIndex(pii.FieldTaxID, "12345678901"), kr.BlindIndex(pii.FieldEmail, "12345678901")) {
		t.Fatal("blind index does not depend on the field")
	}
	other, _ := ring(t, "k1")
	if same(other.BlindIndex(pii.FieldEmail, "ayse@example.com"), kr.BlindIndex(pii.FieldEmail, "ayse@example.com")) {
		t.Fatal("blind index does not depend on the key")
	}
	h := kr.SearchHash(pii.FieldEmail, "Ayse@Example.com")
	if h != kr.SearchHash(pii.FieldEmail, "ayse@example.com ") || h == kr.SearchHash(pii.FieldEmail, "ayse@example.org") {
		t.Fatal("search hash is not a stable function of the normalised search")
	}
	bidx := kr.BlindIndex(pii.FieldEmail, "ayse@example.com")
	for _, enc := range []*base64.Encoding{base64.RawURLEncoding, base64.StdEncoding} {
		if strings.Contains(h, enc.EncodeToString(bidx)[:16]) {
			t.Fatal("the search hash carries the blind index")
		}
	}
	if strings.Contains(h, "ayse@") {
		t.Fatal("the search hash carries the search")
	}
}

func TestMaskRules(t *testing.T) {
	t.Parallel()
	cases := []struct {
		rule     pii.Rule
		in, want string
	}{
		{pii.Name, "Ahmet Yılmaz", "A*** Y***"},
		{pii.Name, "ayşe", "a***"},
		{pii.Email, "ahmet@example.com", "a***@e***.com"},
		{pii.Email, "not-an-email", pii.Masked},
		{pii.TaxID, "12345678901", "*******01"},
		{pii.TaxID, "123 456 789-01", "*******01"},
		{pii.TaxID, "1234", "*******"},
		{pii.Phone, "+90 (532) 123 45 67", "*******67"},
		{pii.Phone, "12", "*******"},
		{pii.Address, "Bağdat Cd. 12, İstanbul", pii.Redacted},
		{pii.FreeText, "call me at 0532", pii.Redacted},
		{pii.Safe, "10.00", "10.00"},
	}
	for _, c := range cases {
		if got := pii.Mask(c.rule, c.in); got != c.want {
			t.Errorf("Mask(%v, %q) = %q, want %q", c.rule, c.in, got, c.want)
		}
	}
}

func TestMaskRecordDefaultDeny(t *testing.T) {
	t.Parallel()
	got := pii.MaskRecord("payment", map[string]string{
		"amount": "10.00", pii.FieldEmail: "ayse@example.com", pii.FieldTaxID: "12345678901",
		"iban": "TR330006100519786457841326", pii.FieldName: "enc:v2:k1:AAAA",
	})
	want := map[string]string{"amount": "10.00", pii.FieldEmail: "a***@e***.com", pii.FieldTaxID: "*******01",
		"iban": pii.Redacted, pii.FieldName: pii.Encrypted}
	for f, w := range want {
		if got[f] != w {
			t.Errorf("MaskRecord[%s] = %q, want %q", f, got[f], w)
		}
	}
	if got := pii.MaskRecord("no_such_table", map[string]string{"amount": "10.00"}); got["amount"] != pii.Redacted {
		t.Errorf("a table without a schema shows %q", got["amount"])
	}
}

const orderPayload = `{"order_id":42,"status":"placed","amount":"10.00","customer":{"name":"Ayşe Yılmaz","email":"ayse@example.com","phone":"+90 532 123 45 67"},` +
	`"shipping_address":{"street":"Bağdat Cd. 12","city":"İstanbul"},"note":"ring twice","gift_message":"for Ayşe","tags":["a","b"],"coupon":null}`

func TestSealPayloadSealsAllButSafeAndRoundTrips(t *testing.T) {
	t.Parallel()
	kr, _ := ring(t, "k1")
	sealed, err := pii.SealPayload(kr, "order.placed.v1", "ev-1", []byte(orderPayload))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(sealed, &m); err != nil {
		t.Fatal(err)
	}
	if m["order_id"] != float64(42) || m["status"] != "placed" || m["amount"] != "10.00" || m["coupon"] != nil {
		t.Fatalf("safe fields changed: %s", sealed)
	}
	cust := m["customer"].(map[string]any)
	for _, v := range []any{cust["name"], cust["email"], cust["phone"], m["shipping_address"], m["note"], m["gift_message"], m["tags"]} {
		if s, ok := v.(string); !ok || !strings.HasPrefix(s, "enc:v2:k1:") {
			t.Fatalf("a sensitive or undeclared field is not sealed: %v in %s", v, sealed)
		}
	}
	// Each canary holds a character base64url never writes (ş, ğ, @, a
	// space): a short run of letters or digits turns up in random
	// ciphertext now and then ("532" did, in CI).
	for _, clear := range []string{"Ayşe", "ayse@example", "532 123", "Bağdat", "ring twice"} {
		if strings.Contains(string(sealed), clear) {
			t.Fatalf("sealed payload carries %q: %s", clear, sealed)
		}
	}
	opened, err := pii.OpenPayload(kr, "order.placed.v1", "ev-1", sealed)
	if err != nil {
		t.Fatal(err)
	}
	if !jsonEqual(t, opened, []byte(orderPayload)) {
		t.Fatalf("round trip:\n%s\n%s", opened, orderPayload)
	}
	if email, err := pii.OpenPayloadField(kr, "order.placed.v1", "ev-1", sealed, "customer.email"); err != nil || string(email) != `"ayse@example.com"` {
		t.Fatalf("OpenPayloadField = %s, %v", email, err)
	}
	again, err := pii.SealPayload(kr, "order.placed.v1", "ev-1", sealed)
	if err != nil || string(again) != string(sealed) {
		t.Fatalf("sealing twice changed the payload: %v", err)
	}
	// Copied to another event or another event type, nothing opens.
	if _, err := pii.OpenPayload(kr, "order.placed.v1", "ev-2", sealed); !errors.Is(err, pii.ErrMalformed) {
		t.Fatalf("payload moved to another event: %v", err)
	}
	if _, err := pii.OpenPayload(kr, "order.paid.v1", "ev-1", sealed); !errors.Is(err, pii.ErrMalformed) {
		t.Fatalf("payload moved to another event type: %v", err)
	}
	// A sealed value moved to another field of the same event.
	swapped := strings.Replace(string(sealed), `"name":"`+cust["name"].(string), `"name":"`+cust["email"].(string), 1)
	if _, err := pii.OpenPayload(kr, "order.placed.v1", "ev-1", []byte(swapped)); !errors.Is(err, pii.ErrMalformed) {
		t.Fatalf("value moved to another field: %v", err)
	}
	if _, err := pii.SealPayload(kr, "no.schema.v1", "ev-1", []byte(`{}`)); !errors.Is(err, pii.ErrNoSchema) {
		t.Fatalf("no schema: %v", err)
	}
	if _, err := pii.SealPayload(nil, "order.paid.v1", "ev-1", []byte(`{"order_id":1,"status":"paid"}`)); err != nil {
		t.Fatalf("safe-only payload without a keyring: %v", err)
	}
	if _, err := pii.SealPayload(nil, "order.paid.v1", "ev-1", []byte(`{"order_id":1,"note":"x"}`)); !errors.Is(err, pii.ErrNoKeyring) {
		t.Fatalf("sensitive payload without a keyring: %v", err)
	}
	for _, bad := range []string{`[1]`, `"x"`, `{`, `{"a":1} {}`} {
		if _, err := pii.SealPayload(kr, "order.paid.v1", "ev-1", []byte(bad)); !errors.Is(err, pii.ErrPayload) {
			t.Errorf("SealPayload(%s): %v", bad, err)
		}
	}
}

func jsonEqual(t testing.TB, a, b []byte) bool {
	t.Helper()
	canon := func(text []byte) string {
		d := json.NewDecoder(bytes.NewReader(text))
		d.UseNumber() // numbers as written: 1e400 is valid JSON
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatalf("%v: %s", err, text)
		}
		out, _ := json.Marshal(v)
		return string(out)
	}
	return canon(a) == canon(b)
}

func TestMaskPayload(t *testing.T) {
	t.Parallel()
	kr, _ := ring(t, "k1")
	clear := string(pii.MaskPayload("order.placed.v1", []byte(orderPayload)))
	for _, want := range []string{`"order_id":42`, `"name":"A*** Y***"`, `"email":"a***@e***.com"`, `"phone":"*******67"`,
		`"shipping_address":"[redacted]"`, `"note":"[redacted]"`, `"gift_message":"[redacted]"`, `"tags":"[redacted]"`} {
		if !strings.Contains(clear, want) {
			t.Errorf("MaskPayload lacks %s: %s", want, clear)
		}
	}
	sealed, _ := pii.SealPayload(kr, "order.placed.v1", "ev-1", []byte(orderPayload))
	if got := string(pii.MaskPayload("order.placed.v1", sealed)); !strings.Contains(got, `"name":"[encrypted]"`) {
		t.Errorf("sealed without keys: %s", got)
	}
	if got := string(kr.MaskSealedPayload("order.placed.v1", "ev-1", sealed)); got != clear {
		t.Errorf("sealed with keys:\n%s\nwant\n%s", got, clear)
	}
	got := string(pii.MaskPayload("unknown.thing.v1", []byte(`{"a":"Ayşe","b":{"c":1,"d":[true,"x"]},"e":null}`)))
	if got != `{"a":"[redacted]","b":{"c":"[redacted]","d":["[redacted]","[redacted]"]},"e":null}` {
		t.Errorf("schema-less payload: %s", got)
	}
	if got := string(pii.MaskPayload("order.placed.v1", []byte(`not json Ayşe`))); strings.Contains(got, "Ayşe") {
		t.Errorf("invalid payload echoed: %s", got)
	}
}

// Payloads written before v2 carry the payment row's v1 envelopes (bound to
// the last key); they open, and rotation rewrites them as v2 for the event.
func TestResealLegacyPayloadAndCensus(t *testing.T) {
	t.Parallel()
	blind := piitest.Bytes(t, 32)
	oldKey, newKey := piitest.Key(t, "old"), piitest.Key(t, "new")
	kr := piitest.Ring(t, blind, newKey, oldKey)
	legacy := `{"operation_id":"op","amount":"1.00","customer":{"email":"` + piitest.SealV1(t, oldKey, "email", "ayse@example.com") +
		`","name":"` + piitest.SealV1(t, oldKey, "name", "Ayşe") + `"}}`
	var before pii.Census
	kr.CensusPayload(&before, "payment.requested.v1", "ev-1", []byte(legacy))
	if before.Values[pii.KeyVersion{KeyID: "old", Version: pii.V1}] != 2 || before.Stale != 2 {
		t.Fatalf("census before: %+v", before)
	}
	out, rewritten, failed, err := kr.ResealPayload("payment.requested.v1", "ev-1", []byte(legacy))
	if err != nil || rewritten != 2 || failed != 0 {
		t.Fatalf("ResealPayload: %d rewritten, %d failed, %v", rewritten, failed, err)
	}
	opened, err := pii.OpenPayload(kr, "payment.requested.v1", "ev-1", out)
	if err != nil || !jsonEqual(t, opened, []byte(`{"operation_id":"op","amount":"1.00","customer":{"email":"ayse@example.com","name":"Ayşe"}}`)) {
		t.Fatalf("after reseal: %s, %v", opened, err)
	}
	var after pii.Census
	kr.CensusPayload(&after, "payment.requested.v1", "ev-1", out)
	if after.Values[pii.KeyVersion{KeyID: "new", Version: pii.V2}] != 2 || after.Stale != 0 {
		t.Fatalf("census after: %+v", after)
	}
	if again, n, _, _ := kr.ResealPayload("payment.requested.v1", "ev-1", out); again != nil || n != 0 {
		t.Fatal("a current payload was rewritten")
	}
	// Without the old key nothing is lost: the value stays, counted.
	lost := piitest.Ring(t, blind, newKey)
	out, rewritten, failed, err = lost.ResealPayload("payment.requested.v1", "ev-1", []byte(legacy))
	if err != nil || out != nil || rewritten != 0 || failed != 2 {
		t.Fatalf("reseal without the old key: %s %d %d %v", out, rewritten, failed, err)
	}
	var c pii.Census
	lost.CensusPayload(&c, "payment.requested.v1", "ev-1", []byte(legacy))
	if c.UnknownKey["old"] != 2 || c.Undecryptable() != 2 {
		t.Fatalf("census without the old key: %+v", c)
	}
}

func TestSealedFieldsListsWhatASealerSealed(t *testing.T) {
	t.Parallel()
	keys, blind, err := pii.GenerateSpec("k1")
	if err != nil {
		t.Fatal(err)
	}
	kr, err := pii.ParseKeyring(keys, blind)
	if err != nil {
		t.Fatal(err)
	}
	payload := []byte(`{"operation_id":"op","amount":"1.00","customer":{"name":"Ada Lovelace","email":"ada@example.com"}}`)
	sealed, err := pii.SealPayload(kr, "payment.requested.v1", "ev-1", payload)
	if err != nil {
		t.Fatal(err)
	}
	got := pii.SealedFields("payment.requested.v1", sealed)
	if strings.Join(got, ",") != "customer.email,customer.name" {
		t.Fatalf("sealed fields %v, want customer.email and customer.name", got)
	}
	if n := len(pii.SealedFields("payment.requested.v1", payload)); n != 0 {
		t.Fatalf("a clear payload lists %d sealed fields", n)
	}
}
