package payments

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/sluice-dev/sluice/internal/testkit"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

type env struct {
	t        *testing.T
	pool     *pgxpool.Pool
	sim      *provider.Simulator
	svc      *Service
	clk      *testkit.Clock
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
	kr              *pii.Keyring // the service's keyring (nil: a fresh one)
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
	if o.kr != nil {
		kr = o.kr
	}
	clk := testkit.NewClock(time.Now().UTC()).Ticking(time.Millisecond)
	reg := prometheus.NewRegistry()
	// The service runs as the application role, as in production (it owns
	// nothing; INSERT and SELECT only on the ledger); tests keep the owner's
	// pool for fixtures and checks.
	svc, err := NewService(dbtest.AppRole(t, pool), provider.NewClient(sim.URL(), o.providerTimeout), kr, Config{Now: clk.Now, Lease: 30 * time.Second}, o.log, reg)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, pool: pool, sim: sim, svc: svc, clk: clk, kr: kr, reg: reg, merchant: "m-1", keys: map[string]string{}}
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

// answer is what Service.Create (or PaymentOf) answered; err is set when
// it returned an error (status 500, as the API answers).
type answer struct {
	status     int
	replayed   bool
	retryAfter int
	body       []byte
	err        error
}

func (a answer) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(a.body, &m); err != nil {
		t.Fatalf("answer %d is not JSON: %q (err %v)", a.status, a.body, a.err)
	}
	return m
}

func (a answer) code(t *testing.T) string {
	s, _ := a.json(t)["code"].(string)
	return s
}

func (e *env) post(key string, req Request) answer {
	return e.postAs(e.merchant, key, req)
}

// postAs pays as merchant (made on first use) through Service.Create.
func (e *env) postAs(merchant, key string, req Request) answer {
	e.t.Helper()
	e.keyOf(merchant)
	resp, err := e.svc.Create(context.Background(), merchant, key, req)
	if err != nil {
		return answer{status: 500, err: err}
	}
	return answer{status: resp.Status, replayed: resp.Replayed, retryAfter: resp.RetryAfter, body: resp.Body}
}

// get is e.merchant's view of a payment (PaymentOf): 200 with the JSON a
// client sees, or 404 not_found.
func (e *env) get(op string) answer {
	e.t.Helper()
	id, err := uuid.Parse(op)
	if err != nil {
		e.t.Fatal(err)
	}
	b, err := e.svc.PaymentOf(context.Background(), e.merchant, id)
	switch {
	case errors.Is(err, ErrNotFound):
		return answer{status: 404, body: ErrorBody(CodeNotFound, "no such payment")}
	case err != nil:
		return answer{status: 500, err: err}
	}
	out, err := json.Marshal(b)
	if err != nil {
		e.t.Fatal(err)
	}
	return answer{status: 200, body: out}
}

// payBody is a valid request of the test customer.
func payBody(invoice string, account int64, amount string) Request {
	return Request{InvoiceID: invoice, AccountID: account, Amount: decimal.RequireFromString(amount), Currency: "TRY",
		Customer: Customer{Name: "Ayşe Yılmaz", Email: "ayse@example.com", TaxID: "12345678901"}}
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

// checkBooks fails the test unless the account's books add up.
func (e *env) checkBooks(id int64) {
	e.t.Helper()
	if err := CheckBooks(context.Background(), e.pool, id); err != nil {
		e.t.Error(err)
	}
}

// shortTimeout is the provider timeout of tests that need a timeout: long
// enough that a definite answer always arrives on a loaded machine; the
// timeouts themselves come from the simulator holding its answer far longer.
const shortTimeout = 2 * time.Second
