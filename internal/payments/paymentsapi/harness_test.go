package paymentsapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/payments/paymentsapi"
	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
	"github.com/sluice-dev/sluice/internal/payments/provider"
	"github.com/sluice-dev/sluice/internal/pii"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// env is the real service behind the real API on a loopback port.
type env struct {
	t        *testing.T
	pool     *pgxpool.Pool
	sim      *provider.Simulator
	svc      *payments.Service
	srv      *httptest.Server
	kr       *pii.Keyring
	reg      *prometheus.Registry
	merchant string            // who e.post and e.get act as
	keys     map[string]string // merchant → its API key (made on first use)
	keysMu   sync.Mutex
}

type envOpts struct {
	log  *slog.Logger // the service's and the API's logger (nil: discarded)
	wrap func(paymentsapi.Payments) paymentsapi.Payments
}

func newEnv(t *testing.T, o envOpts) *env {
	t.Helper()
	pool := dbtest.New(t)
	sim := provider.NewSimulator(provider.SimConfig{})
	if err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	kr := paymentstest.Keyring(t)
	reg := prometheus.NewRegistry()
	svc, err := payments.NewService(pool, provider.NewClient(sim.URL(), 5*time.Second), kr, payments.Config{Lease: 30 * time.Second}, o.log, reg)
	if err != nil {
		t.Fatal(err)
	}
	var api paymentsapi.Payments = svc
	if o.wrap != nil {
		api = o.wrap(api)
	}
	srv := startAPI(t, api, o.log, reg)
	return &env{t: t, pool: pool, sim: sim, svc: svc, srv: srv, kr: kr, reg: reg, merchant: "m-1", keys: map[string]string{}}
}

// startAPI serves the API on a loopback port, with the Host allowlist a
// real listener gets.
func startAPI(t testing.TB, svc paymentsapi.Payments, log *slog.Logger, reg prometheus.Registerer) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	h, err := paymentsapi.New(svc, paymentsapi.Config{AllowedHosts: paymentsapi.AllowedHosts(srv.Listener.Addr().String(), nil), Logger: log, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = h
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// keyOf is the API key of a merchant of this env (made on first use).
func (e *env) keyOf(merchant string) string {
	e.t.Helper()
	e.keysMu.Lock()
	defer e.keysMu.Unlock()
	if k, ok := e.keys[merchant]; ok {
		return k
	}
	k := paymentstest.Merchant(e.t, e.pool, paymentstest.MerchantOpts{ID: merchant})
	e.keys[merchant] = k
	return k
}

// account opens an account of e.merchant.
func (e *env) account(id int64, balance string) { e.accountOf(e.merchant, id, balance) }

// accountOf opens an account owned by merchant.
func (e *env) accountOf(merchant string, id int64, balance string) {
	e.t.Helper()
	e.keyOf(merchant)
	paymentstest.Account(e.t, e.pool, paymentstest.AccountOpts{ID: id, Merchant: merchant, Balance: balance})
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(a.body, &m); err != nil {
		t.Fatalf("answer %d is not JSON: %q", a.status, a.body)
	}
	return m
}

func (a answer) code(t *testing.T) string {
	s, _ := a.json(t)["code"].(string)
	return s
}

func (e *env) post(key, body string) answer { return e.postAs(e.merchant, key, body) }

// postAs pays as merchant (its API key; "" sends no Authorization).
func (e *env) postAs(merchant, key, body string) answer {
	e.t.Helper()
	apiKey := ""
	if merchant != "" {
		apiKey = e.keyOf(merchant)
	}
	return e.postWithKey(apiKey, key, body)
}

// postWithKey pays with a raw API key ("" sends no Authorization).
func (e *env) postWithKey(apiKey, key, body string) answer {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/payments", bytes.NewBufferString(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	return e.do(req)
}

func (e *env) do(req *http.Request) answer {
	e.t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Errorf("%s %s: %v", req.Method, req.URL.Path, err)
		return answer{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b}
}

func (e *env) get(op string) answer {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/v1/payments/"+op, nil)
	req.Header.Set("Authorization", "Bearer "+e.keyOf(e.merchant))
	return e.do(req)
}

func payBody(invoice string, account int64, amount string) string {
	return fmt.Sprintf(`{"invoice_id":%q,"account_id":%d,"amount":%q,"currency":"TRY","customer":{"name":"Ayşe Yılmaz","email":"ayse@example.com","tax_id":"12345678901"}}`, invoice, account, amount)
}

func newKey() string { return uuid.NewString() }

func opOf(t *testing.T, a answer) uuid.UUID {
	t.Helper()
	op, err := uuid.Parse(fmt.Sprint(a.json(t)["operation_id"]))
	if err != nil {
		t.Fatalf("answer %d has no operation_id: %s", a.status, a.body)
	}
	return op
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// syncBuffer is a log sink many goroutines write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
