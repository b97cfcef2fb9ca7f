package paymentsapi_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/payments/paymentsapi"
)

// Merchant A's key cannot debit B's account (403, the same answer as for an
// account that does not exist), cannot read B's payment (404, as for a
// missing one), and cannot squat B's Idempotency-Keys: the same key is A's
// own key, and B's answer stays B's. X-Merchant-ID changes nothing.
func TestMerchantIsolation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.accountOf("m-a", 1, "1000")
	e.accountOf("m-b", 2, "1000")

	foreign := e.postAs("m-a", newKey(), payBody("inv-x", 2, "10"))
	missing := e.postAs("m-a", newKey(), payBody("inv-y", 999, "10"))
	if foreign.status != 403 || foreign.code(t) != payments.CodeAccountForbidden {
		t.Fatalf("A debits B's account: %d %s", foreign.status, foreign.body)
	}
	if missing.status != foreign.status || !bytes.Equal(missing.body, foreign.body) {
		t.Fatalf("a missing account answers differently from a foreign one:\n%d %s\n%d %s", missing.status, missing.body, foreign.status, foreign.body)
	}

	// B pays under keys K1 and K2; A then uses them: K1 with B's exact
	// request, K2 for a payment of its own. Neither gets B's answer.
	k1, k2 := newKey(), newKey()
	bPaid := e.postAs("m-b", k1, payBody("inv-b", 2, "25"))
	bPaid2 := e.postAs("m-b", k2, payBody("inv-b2", 2, "1"))
	if bPaid.status != 201 || bPaid2.status != 201 {
		t.Fatalf("B pays: %d %s / %d %s", bPaid.status, bPaid.body, bPaid2.status, bPaid2.body)
	}
	squat := e.postAs("m-a", k1, payBody("inv-b", 2, "25"))
	if squat.status != 403 || squat.header.Get("Idempotent-Replayed") != "" || bytes.Contains(squat.body, []byte(opOf(t, bPaid).String())) {
		t.Fatalf("A replaying B's key got B's answer: %d %v %s", squat.status, squat.header, squat.body)
	}
	own := e.postAs("m-a", k2, payBody("inv-a", 1, "5"))
	if own.status != 201 || own.header.Get("Idempotent-Replayed") != "" || opOf(t, own) == opOf(t, bPaid2) {
		t.Fatalf("A's payment under B's key: %d %v %s", own.status, own.header, own.body)
	}
	for k, first := range map[string]answer{k1: bPaid, k2: bPaid2} {
		body := payBody("inv-b", 2, "25")
		if k == k2 {
			body = payBody("inv-b2", 2, "1")
		}
		if again := e.postAs("m-b", k, body); again.status != 201 || !bytes.Equal(again.body, first.body) {
			t.Fatalf("B's key no longer answers B: %d %s", again.status, again.body)
		}
	}

	// A cannot read B's payment.
	e.merchant = "m-a"
	if g := e.get(opOf(t, bPaid).String()); g.status != 404 || g.code(t) != payments.CodeNotFound {
		t.Fatalf("A reads B's payment: %d %s", g.status, g.body)
	}
	e.merchant = "m-b"
	if g := e.get(opOf(t, bPaid).String()); g.status != 200 {
		t.Fatalf("B reads its payment: %d %s", g.status, g.body)
	}

	// X-Merchant-ID is ignored: A naming B still pays as A, from A's accounts only.
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/payments", strings.NewReader(payBody("inv-hdr", 2, "5")))
	req.Header.Set("Authorization", "Bearer "+e.keyOf("m-a"))
	req.Header.Set("Idempotency-Key", newKey())
	req.Header.Set("X-Merchant-ID", "m-b")
	if a := e.do(req); a.status != 403 {
		t.Fatalf("X-Merchant-ID: m-b let A debit B's account: %d %s", a.status, a.body)
	}
	if n := e.count(`SELECT count(*) FROM payment WHERE account_id = 2 AND merchant_id <> 'm-b'`); n != 0 {
		t.Fatalf("%d payments of other merchants debit B's account", n)
	}
	if b, err := payments.GetAccount(context.Background(), e.pool, 2); err != nil || b.Balance.String() != "974" {
		t.Fatalf("B's balance %s, want 974", b.Balance)
	}
}

// No key, a malformed or unknown key, a revoked key → 401 with
// WWW-Authenticate: Bearer, nothing written. A merchant's second key keeps
// working when the first is revoked (rotation).
func TestAPIKeysRequiredAndRevocable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "1000")
	ctx := context.Background()
	oldKey := e.keyOf(e.merchant)
	newAPIKey, _, err := payments.CreateKey(ctx, e.pool, e.merchant)
	if err != nil {
		t.Fatal(err)
	}
	if a := e.postWithKey(oldKey, newKey(), payBody("inv-1", 1, "1")); a.status != 201 {
		t.Fatalf("valid key: %d %s", a.status, a.body)
	}
	oldID := strings.Split(strings.TrimPrefix(oldKey, "slk_"), "_")[0]
	if _, err := payments.RevokeKey(ctx, e.pool, oldID); err != nil {
		t.Fatal(err)
	}
	forged := oldKey[:len(oldKey)-4] + "0000"
	if forged == oldKey {
		forged = oldKey[:len(oldKey)-4] + "1111"
	}
	before := e.count(`SELECT count(*) FROM idempotency_record`)
	for name, k := range map[string]string{
		"missing": "", "garbage": "not-a-key", "revoked": oldKey, "forged secret": forged,
		"unknown id": "slk_0123456789abcdef_" + strings.Repeat("ab", 32),
	} {
		a := e.postWithKey(k, newKey(), payBody("inv-2", 1, "1"))
		if a.status != 401 || a.code(t) != payments.CodeUnauthorized || !strings.HasPrefix(a.header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s key: %d %q %s", name, a.status, a.header.Get("WWW-Authenticate"), a.body)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/v1/payments/00000000-0000-0000-0000-000000000000", nil)
	req.Header.Set("Authorization", "Bearer "+oldKey)
	if a := e.do(req); a.status != 401 {
		t.Errorf("GET with a revoked key: %d", a.status)
	}
	if after := e.count(`SELECT count(*) FROM idempotency_record`); after != before {
		t.Errorf("refused requests wrote %d idempotency records", after-before)
	}
	if a := e.postWithKey(newAPIKey, newKey(), payBody("inv-3", 1, "1")); a.status != 201 {
		t.Fatalf("the merchant's second key after revoking the first: %d %s", a.status, a.body)
	}
	keys, err := payments.ListKeys(ctx, e.pool, e.merchant)
	if err != nil || len(keys) != 2 || keys[0].RevokedAt == nil || keys[1].RevokedAt != nil {
		t.Fatalf("keys: %+v %v", keys, err)
	}
}

// A Host that is not the listen address or a configured name is refused
// before anything else (DNS rebinding); health routes answer any Host.
func TestWrongHostRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "1000")
	_, port, _ := net.SplitHostPort(e.srv.Listener.Addr().String())
	send := func(host, path string) answer {
		var body io.Reader
		method := http.MethodGet
		if path == "/v1/payments" {
			method, body = http.MethodPost, strings.NewReader(payBody("inv-h-"+host, 1, "1"))
		}
		req, _ := http.NewRequest(method, e.srv.URL+path, body)
		req.Host = host
		req.Header.Set("Authorization", "Bearer "+e.keyOf(e.merchant))
		req.Header.Set("Idempotency-Key", newKey())
		return e.do(req)
	}
	for _, host := range []string{"evil.example:" + port, "evil.example", "127.0.0.1.evil.example:" + port, "127.0.0.1:1"} {
		if a := send(host, "/v1/payments"); a.status != http.StatusMisdirectedRequest || a.code(t) != payments.CodeMisdirected {
			t.Errorf("Host %s: %d %s, want 421", host, a.status, a.body)
		}
	}
	if n := e.count(`SELECT count(*) FROM idempotency_record`); n != 0 {
		t.Fatalf("refused hosts wrote %d records", n)
	}
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "LOCALHOST:" + port} {
		if a := send(host, "/v1/payments"); a.status != 201 {
			t.Errorf("Host %s: %d %s, want 201", host, a.status, a.body)
		}
	}
	if a := send("evil.example", "/healthz"); a.status != 200 {
		t.Errorf("healthz with another Host: %d", a.status)
	}
	// Configured names: "name" on any port, "name:port" on that port only.
	allowed := paymentsapi.AllowedHosts("0.0.0.0:8081", []string{"pay.example.com", "api.example.com:443"})
	want := []string{"pay.example.com", "api.example.com:443"}
	if strings.Join(allowed, ",") != strings.Join(want, ",") {
		t.Fatalf("AllowedHosts on all interfaces = %v, want only the configured names %v", allowed, want)
	}
	// A Host the allowlist takes reaches authentication (401 without a
	// key); any other is refused before it (421).
	router, err := paymentsapi.New(e.svc, paymentsapi.Config{AllowedHosts: allowed})
	if err != nil {
		t.Fatal(err)
	}
	for host, ok := range map[string]bool{"pay.example.com": true, "pay.example.com:8081": true, "api.example.com:443": true,
		"api.example.com:8081": false, "api.example.com": false, "0.0.0.0:8081": false, "evil.example": false} {
		req := httptest.NewRequest(http.MethodGet, "/v1/payments/"+uuid.NewString(), nil)
		req.Host = host
		rec := httptest.NewRecorder()
		router.ServeHTTP(rec, req)
		if (rec.Code != http.StatusMisdirectedRequest) != ok {
			t.Errorf("allowlist %v, Host %s: %d", allowed, host, rec.Code)
		}
	}
}

// API keys never reach the log, whatever happens to the request: a
// successful payment, a revoked key, a forged one, a server error.
func TestAPIKeysNeverLogged(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	crash := &crashing{}
	e := newEnv(t, envOpts{log: log, wrap: func(p paymentsapi.Payments) paymentsapi.Payments { crash.Payments = p; return crash }})
	e.account(1, "1000")
	key := e.keyOf(e.merchant)
	secret := key[strings.LastIndex(key, "_")+1:]
	e.post(newKey(), payBody("inv-1", 1, "1"))
	crash.on.Store(true)
	if a := e.post(newKey(), payBody("inv-2", 1, "1")); a.status != 500 {
		t.Fatalf("crash: %d", a.status)
	}
	crash.on.Store(false)
	if _, err := payments.RevokeKey(context.Background(), e.pool, strings.Split(strings.TrimPrefix(key, "slk_"), "_")[0]); err != nil {
		t.Fatal(err)
	}
	e.post(newKey(), payBody("inv-3", 1, "1"))
	e.postWithKey(key[:len(key)-2]+"zz", newKey(), payBody("inv-4", 1, "1"))
	if !strings.Contains(logs.String(), "payments: request failed") {
		t.Fatalf("the crash was not logged, so the log was not captured:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), secret) || strings.Contains(logs.String(), secret[:16]) {
		t.Fatalf("an API key reached the log:\n%s", logs.String())
	}
}

// crashing is the real service whose Create fails while on: the server
// error path, for tests of what that path writes.
type crashing struct {
	paymentsapi.Payments
	on atomic.Bool
}

func (c *crashing) Create(ctx context.Context, merchantID, key string, req payments.Request) (payments.Response, error) {
	if c.on.Load() {
		return payments.Response{}, errors.New("test: the service crashed")
	}
	return c.Payments.Create(ctx, merchantID, key, req)
}

// /metrics carries request latency by route template and status (never a
// raw path), replays, and reservations.
func TestRequestMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "1000")
	k := newKey()
	a := e.post(k, payBody("inv-m", 1, "1"))
	e.post(k, payBody("inv-m", 1, "1"))
	e.get(opOf(t, a).String())
	e.postWithKey("", newKey(), payBody("inv-n", 1, "1"))
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	text := rec.Body.String()
	for _, want := range []string{
		`sluice_payments_http_request_duration_seconds_count{code="201",route="/v1/payments"} 2`,
		`sluice_payments_http_request_duration_seconds_count{code="401",route="/v1/payments"} 1`,
		`sluice_payments_http_request_duration_seconds_count{code="200",route="/v1/payments/:operation_id"} 1`,
		`sluice_idempotency_replays_total 1`,
		`sluice_payments_reservations_total 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(text, opOf(t, a).String()) {
		t.Errorf("an operation id is a label value")
	}
}
