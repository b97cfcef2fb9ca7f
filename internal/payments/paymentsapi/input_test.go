package paymentsapi_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// Missing key, malformed JSON, bad amounts, unknown currency, oversized
// body… → 400/422 with a clear code, nothing written.
func TestBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	good := payBody("inv-ok", 1, "10")
	big := `{"invoice_id":"inv-big","account_id":1,"amount":"1","currency":"TRY","customer":{"name":"` + strings.Repeat("a", 20000) + `","email":"a@b.com"}}`
	cases := []struct {
		name, merchant, key, body string
		status                    int
		code                      string
	}{
		{"no key", "m-1", "", good, 400, payments.CodeMissingKey},
		{"long key", "m-1", strings.Repeat("k", 256), good, 400, payments.CodeInvalidKey},
		{"no API key", "", newKey(), good, 401, payments.CodeUnauthorized},
		{"malformed", "m-1", newKey(), `{"invoice_id": "x",`, 400, "malformed_json"},
		{"not an object", "m-1", newKey(), `[1,2]`, 400, "invalid_field"},
		{"trailing data", "m-1", newKey(), good + `{}`, 400, "malformed_json"},
		{"unknown field", "m-1", newKey(), strings.Replace(good, `"currency"`, `"admin":true,"currency"`, 1), 400, "unknown_field"},
		// encoding/json matches names without regard to case and keeps the
		// last of a repeated one: a gateway reading the first "amount" saw
		// 10.00 where 9999.00 was charged.
		{"name in another case", "m-1", newKey(), strings.Replace(good, `"currency"`, `"AMOUNT":"9999.00","currency"`, 1), 400, "unknown_field"},
		{"Currency", "m-1", newKey(), strings.Replace(good, `"currency"`, `"Currency"`, 1), 400, "unknown_field"},
		{"repeated name", "m-1", newKey(), strings.Replace(good, `"currency"`, `"amount":"9999.00","currency"`, 1), 400, "duplicate_field"},
		{"customer's name in another case", "m-1", newKey(), strings.Replace(good, `"name"`, `"Name"`, 1), 400, "unknown_field"},
		{"customer's repeated email", "m-1", newKey(), strings.Replace(good, `"email"`, `"email":"x@y.z","email"`, 1), 400, "duplicate_field"},
		{"escaped name", "m-1", newKey(), strings.Replace(good, `"amount"`, `"\u0061mount"`, 1), 400, "unknown_field"},
		{"array of objects", "m-1", newKey(), `[{"admin":1}]`, 400, "invalid_field"},
		{"object where a value goes", "m-1", newKey(), strings.Replace(good, `"amount":"10"`, `"amount":{"amount":1,"amount":2}`, 1), 400, "invalid_field"},
		{"trailing object", "m-1", newKey(), `{} {"AMOUNT":1}`, 400, "malformed_json"},
		{"negative", "m-1", newKey(), payBody("i", 1, "-5"), 422, "invalid_amount"},
		{"zero", "m-1", newKey(), payBody("i", 1, "0.00"), 422, "invalid_amount"},
		{"absurd", "m-1", newKey(), payBody("i", 1, "1e15"), 422, "amount_out_of_range"},
		{"three decimals", "m-1", newKey(), payBody("i", 1, "10.001"), 422, "amount_precision"},
		{"not a number", "m-1", newKey(), payBody("i", 1, "ten"), 422, "invalid_amount"},
		{"NaN", "m-1", newKey(), payBody("i", 1, "NaN"), 422, "invalid_amount"},
		{"currency", "m-1", newKey(), strings.Replace(good, `"TRY"`, `"XYZ"`, 1), 422, "unsupported_currency"},
		{"no customer", "m-1", newKey(), `{"invoice_id":"i","account_id":1,"amount":"1","currency":"TRY"}`, 422, "missing_field"},
		{"no invoice", "m-1", newKey(), `{"account_id":1,"amount":"1","currency":"TRY","customer":{"name":"a","email":"a@b.c"}}`, 422, "missing_field"},
		{"bad email", "m-1", newKey(), strings.Replace(good, "ayse@example.com", "nope", 1), 422, "invalid_customer"},
		{"bad account", "m-1", newKey(), payBody("i", -3, "1"), 422, "invalid_account_id"},
		{"oversized", "m-1", newKey(), big, 400, payments.CodeBodyTooLarge},
		// encoding/json turns invalid UTF-8 into U+FFFD: the payment would
		// keep and send on a name the client never wrote.
		{"invalid UTF-8", "m-1", newKey(), strings.Replace(good, "Ayşe", "Ay\xff\xfee", 1), 400, "malformed_json"},
		// strings.ToUpper("uſd") is "USD": a long s is not an s.
		{"currency's letters mapped onto ASCII", "m-1", newKey(), strings.Replace(good, `"TRY"`, `"uſd"`, 1), 422, "unsupported_currency"},
		{"NUL in the email", "m-1", newKey(), strings.Replace(good, "ayse@example.com", `ayse\u0000@example.com`, 1), 422, "invalid_customer"},
		{"escape in the name", "m-1", newKey(), strings.Replace(good, "Ayşe", `Ay\u001b[31mşe`, 1), 422, "invalid_customer"},
		{"NUL in the tax id", "m-1", newKey(), strings.Replace(good, "12345678901", `1234\u00005678901`, 1), 422, "invalid_customer"},
		{"tab in the name", "m-1", newKey(), strings.Replace(good, "Ayşe Yılmaz", `Ayşe\tYılmaz`, 1), 422, "invalid_customer"},
		{"41-digit amount", "m-1", newKey(), payBody("i", 1, strings.Repeat("1", 41)), 422, "invalid_amount"},
	}
	for _, c := range cases {
		a := e.postAs(c.merchant, c.key, c.body)
		if a.status != c.status || a.code(t) != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, a.status, a.body, c.status, c.code)
		}
		if strings.Contains(string(a.body), "ayse@") {
			t.Errorf("%s: answer echoes PII: %s", c.name, a.body)
		}
	}
	for _, table := range []string{"idempotency_record", "payment", "balance_reservation", "outbox_event"} {
		if n := e.count(`SELECT count(*) FROM ` + table); n != 0 {
			t.Errorf("%s has %d rows after bad input", table, n)
		}
	}
	if n := e.count(`SELECT count(*) FROM ledger_entry WHERE entry_type = 'debit'`); n != 0 || len(e.sim.Charges()) != 0 {
		t.Errorf("bad input reached the ledger or the provider")
	}
	// A well-formed request for an account that does not exist is refused
	// like one for another merchant's account (403), stored as the key's
	// result, with no payment.
	key := newKey()
	a := e.post(key, payBody("inv-nope", 99, "10"))
	if a.status != 403 || a.code(t) != payments.CodeAccountForbidden {
		t.Fatalf("unknown account: %d %s", a.status, a.body)
	}
	if n := e.count(`SELECT count(*) FROM payment`); n != 0 {
		t.Fatalf("payment written for an unknown account")
	}
}

// The canary of the domain's TestPIICanaryNeverLeaks, for what only the
// transport sees: requests refused while parsing (a malformed email, a
// currency that is the customer's name) and the owner's GET. No answer and
// no log line carries the personal data in clear.
func TestPIICanaryNeverLeaksFromTheAPI(t *testing.T) {
	t.Parallel()
	const (
		name  = "Zebulon Canaryfield"
		email = "zebulon.canaryfield@canary-mail.example"
	)
	logs := &testkit.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := newEnv(t, envOpts{log: log})
	e.account(1, "5000")
	body := func(invoice, email, currency string) string {
		return fmt.Sprintf(`{"invoice_id":%q,"account_id":1,"amount":"10","currency":%q,"customer":{"name":%q,"email":%q}}`, invoice, currency, name, email)
	}
	var answers []string
	for _, b := range []string{body("inv-ok", email, "TRY"), body("inv-bad", "no-at-sign-canary-mail.example", "TRY"), body("inv-bad2", email, name)} {
		answers = append(answers, string(e.post(newKey(), b).body))
	}
	ok := e.post(newKey(), body("inv-ok", email, "TRY")) // same invoice, new key: 422 naming the first
	answers = append(answers, string(ok.body))
	g := e.get(fmt.Sprint(ok.json(t)["operation_id"]))
	if g.status != 200 || !strings.Contains(string(g.body), "customer") {
		t.Fatalf("GET: %d %s", g.status, g.body)
	}
	answers = append(answers, string(g.body))
	for _, where := range []string{strings.Join(answers, "\n"), logs.String()} {
		for _, c := range []string{name, "Canaryfield", "canaryfield", email, "canary-mail"} {
			if strings.Contains(where, c) {
				t.Errorf("%q in clear:\n%s", c, where)
			}
		}
	}
}

// Two Idempotency-Key header lines are refused, not read as the first:
// a proxy may fold them into one line or keep the last, and would then see
// another key than the service for one request.
func TestTwoIdempotencyKeysAreRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/payments", strings.NewReader(payBody("inv-2keys", 1, "10")))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+e.keyOf("m-1"))
	req.Header.Add("Idempotency-Key", newKey())
	req.Header.Add("Idempotency-Key", newKey())
	a := e.do(req)
	if a.status != 400 || a.code(t) != payments.CodeInvalidKey {
		t.Fatalf("two Idempotency-Key headers: %d %s, want 400 %s", a.status, a.body, payments.CodeInvalidKey)
	}
	if n := e.count(`SELECT count(*) FROM idempotency_record`) + e.count(`SELECT count(*) FROM payment`); n != 0 {
		t.Errorf("%d rows written for a request with two keys", n)
	}
}
