package web_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/payments/paymentsapi"
	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
	"github.com/sluice-dev/sluice/internal/payments/provider"
)

// paymentsAPI is the reference payments service in-process, on the
// console's database, with a simulated provider.
type paymentsAPI struct {
	sim *provider.Simulator
	srv *httptest.Server
	key string
}

func newPaymentsAPI(t *testing.T, pool *pgxpool.Pool) *paymentsAPI {
	t.Helper()
	sim := provider.NewSimulator(provider.SimConfig{HangFor: 3 * time.Second})
	if err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	// The client gives up long before the simulator answers a held charge:
	// the outcome is unknown.
	svc, err := payments.NewService(pool, provider.NewClient(sim.URL(), 300*time.Millisecond), paymentstest.Keyring(t), payments.Config{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	key := paymentstest.Merchant(t, pool, paymentstest.MerchantOpts{ID: "m-api"})
	paymentstest.Account(t, pool, paymentstest.AccountOpts{ID: 4242, Merchant: "m-api", Balance: "1000.00"})
	srv := httptest.NewUnstartedServer(nil)
	h, err := paymentsapi.New(svc, paymentsapi.Config{AllowedHosts: paymentsapi.AllowedHosts(srv.Listener.Addr().String(), nil)})
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = h
	srv.Start()
	t.Cleanup(srv.Close)
	return &paymentsAPI{sim: sim, srv: srv, key: key}
}

type apiAnswer struct {
	status int
	header http.Header
	body   []byte
}

func (a apiAnswer) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(a.body, &m); err != nil {
		t.Fatalf("answer %d is not JSON: %q", a.status, a.body)
	}
	return m
}

func (p *paymentsAPI) post(t *testing.T, idemKey, body string) apiAnswer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, p.srv.URL+"/v1/payments", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+p.key)
	req.Header.Set("Idempotency-Key", idemKey)
	resp, err := p.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return apiAnswer{status: resp.StatusCode, header: resp.Header, body: data}
}
