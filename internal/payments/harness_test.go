package payments

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
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
	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/payments/provider"
	"github.com/sluice-dev/sluice/internal/pii"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// clock is an injected time source tests move forward instead of sleeping.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

// Now ticks a millisecond per call, so no two reads are equal (as on a
// real clock: a value computed twice must not match by accident).
func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(time.Millisecond)
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type env struct {
	t        *testing.T
	pool     *pgxpool.Pool
	sim      *provider.Simulator
	svc      *Service
	srv      *httptest.Server
	clk      *clock
	kr       *pii.Keyring
	reg      *prometheus.Registry
	merchant string            // who e.post and e.get act as
	keys     map[string]string // merchant → its API key (made on first use)
	keysMu   sync.Mutex
}

type envOpts struct {
	providerTimeout time.Duration
	sim             provider.SimConfig
	log             *slog.Logger // the service's logger (nil: discarded)
}

func newEnv(t *testing.T, o envOpts) *env {
	t.Helper()
	if o.providerTimeout == 0 {
		o.providerTimeout = 5 * time.Second
	}
	pool := dbtest.New(t)
	sim := provider.NewSimulator(o.sim)
	if err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	keys, blind, err := pii.GenerateSpec("t1")
	if err != nil {
		t.Fatal(err)
	}
	kr, err := pii.ParseKeyring(keys, blind)
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{now: time.Now().UTC()}
	reg := prometheus.NewRegistry()
	svc, err := NewService(pool, provider.NewClient(sim.URL(), o.providerTimeout), kr, Config{Now: clk.Now, Lease: 30 * time.Second}, o.log, reg)
	if err != nil {
		t.Fatal(err)
	}
	srv := startAPI(t, svc)
	return &env{t: t, pool: pool, sim: sim, svc: svc, srv: srv, clk: clk, kr: kr, reg: reg, merchant: "m-1", keys: map[string]string{}}
}

// startAPI serves the service's API on a loopback port, with the Host
// allowlist a real listener gets.
func startAPI(t testing.TB, svc *Service) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	srv.Config.Handler = svc.Handler(AllowedHosts(srv.Listener.Addr().String(), nil))
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// merchantKey is the factory for merchants: it creates the merchant and an
// API key on first use and returns the key.
func merchantKey(t testing.TB, pool *pgxpool.Pool, merchant string) string {
	t.Helper()
	ctx := context.Background()
	if err := CreateMerchant(ctx, pool, merchant, "test "+merchant); err != nil && !errors.Is(err, ErrMerchantExists) {
		t.Fatalf("create merchant %s: %v", merchant, err)
	}
	key, _, err := CreateKey(ctx, pool, merchant)
	if err != nil {
		t.Fatalf("create key for %s: %v", merchant, err)
	}
	return key
}

// keyOf is the API key of a merchant of this env (made on first use).
func (e *env) keyOf(merchant string) string {
	e.t.Helper()
	e.keysMu.Lock()
	defer e.keysMu.Unlock()
	if k, ok := e.keys[merchant]; ok {
		return k
	}
	k := merchantKey(e.t, e.pool, merchant)
	e.keys[merchant] = k
	return k
}

// account opens an account of e.merchant.
func (e *env) account(id int64, balance string) {
	e.t.Helper()
	e.accountOf(e.merchant, id, balance)
}

// accountOf opens an account owned by merchant.
func (e *env) accountOf(merchant string, id int64, balance string) {
	e.t.Helper()
	e.keyOf(merchant)
	if err := CreateAccount(context.Background(), e.pool, merchant, id, "TRY", decimal.RequireFromString(balance)); err != nil {
		e.t.Fatal(err)
	}
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

func (e *env) post(key, body string) answer {
	return e.postAs(e.merchant, key, body)
}

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
		e.t.Errorf("POST: %v", err)
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

func randomInvoice() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return fmt.Sprintf("inv-%x", b)
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (e *env) accountState(id int64) Account {
	e.t.Helper()
	a, err := GetAccount(context.Background(), e.pool, id)
	if err != nil {
		e.t.Fatal(err)
	}
	return a
}

// checkBooks: reserved equals the active reservations, and the balance
// equals the ledger's credits minus debits.
func (e *env) checkBooks(id int64) {
	e.t.Helper()
	a := e.accountState(id)
	var active, ledger string
	if err := e.pool.QueryRow(context.Background(), `SELECT coalesce(sum(amount), 0)::text FROM balance_reservation WHERE account_id = $1 AND status = 'active'`, id).Scan(&active); err != nil {
		e.t.Fatal(err)
	}
	if err := e.pool.QueryRow(context.Background(), `SELECT coalesce(sum(CASE WHEN entry_type = 'credit' THEN amount ELSE -amount END), 0)::text FROM ledger_entry WHERE account_id = $1`, id).Scan(&ledger); err != nil {
		e.t.Fatal(err)
	}
	if !a.Reserved.Equal(decimal.RequireFromString(active)) {
		e.t.Errorf("account %d: reserved %s but active reservations sum to %s", id, a.Reserved, active)
	}
	if !a.Balance.Equal(decimal.RequireFromString(ledger)) {
		e.t.Errorf("account %d: balance %s but the ledger says %s", id, a.Balance, ledger)
	}
	if a.Balance.IsNegative() || a.Available().IsNegative() {
		e.t.Errorf("account %d: balance %s reserved %s", id, a.Balance, a.Reserved)
	}
}

// waitFor polls cond up to 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// shortTimeout is the provider timeout of tests that need a timeout: long
// enough that a definite answer always arrives on a loaded machine; the
// timeouts themselves come from the simulator holding its answer far longer.
const shortTimeout = 2 * time.Second
