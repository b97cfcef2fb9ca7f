package payments

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-dev/sluice/internal/payments/provider"
	"github.com/sluice-dev/sluice/internal/pii"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// Canary personal data, recognisable anywhere it might leak.
const (
	canaryName  = "Zebulon Canaryfield"
	canaryEmail = "zebulon.canaryfield@canary-mail.example"
	canaryTaxID = "98765432109"
)

func canaryBody(invoice string, account int64, amount string) Request {
	r := payBody(invoice, account, amount)
	r.Customer = Customer{Name: canaryName, Email: canaryEmail, TaxID: canaryTaxID}
	return r
}

// leaks names the canary fragments found in text.
func leaks(text string) []string {
	var found []string
	for _, c := range []string{canaryName, "Canaryfield", "canaryfield", canaryEmail, "canary-mail", canaryTaxID} {
		if strings.Contains(text, c) {
			found = append(found, c)
		}
	}
	return found
}

// SECURITY case 12 for the payments service: payments carrying canary
// personal data go through every path that writes a log line, a metric, an
// event or a stored answer — success, decline, provider down, charge then
// timeout (unknown), reconcile, a crash and lease recovery, insufficient
// funds, a duplicate invoice, a reused key — with the
// service and the simulator logging at debug level. The canary never appears
// in clear in a log line, the /metrics text, an outbox payload or header, a
// stored idempotency answer or hash, an answer or the owner's view, or any payment column
// but the encrypted customer envelopes (which must still decrypt to it).
func TestPIICanaryNeverLeaks(t *testing.T) {
	t.Parallel()
	logs := &testkit.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := newEnv(t, envOpts{providerTimeout: shortTimeout, log: log, sim: provider.SimConfig{Logger: log, HangFor: time.Minute}})
	e.account(1, "5000")
	e.account(2, "1")
	ctx := context.Background()
	var answers []string
	post := func(key string, body Request) answer {
		a := e.post(key, body)
		answers = append(answers, string(a.body))
		return a
	}

	post(newKey(), canaryBody("inv-ok", 1, "10"))
	e.sim.Next(provider.BehaveDecline)
	post(newKey(), canaryBody("inv-decline", 1, "10"))
	e.sim.Next(provider.BehaveDown)
	post(newKey(), canaryBody("inv-down", 1, "10"))
	e.sim.Next(provider.BehaveTimeoutAfterCharge)
	unknown := post(newKey(), canaryBody("inv-unknown", 1, "10"))
	if unknown.status != 202 {
		t.Fatalf("timeout after charge: %d %s", unknown.status, unknown.body)
	}
	post(newKey(), canaryBody("inv-poor", 2, "10"))
	dupKey := newKey()
	post(dupKey, canaryBody("inv-ok", 1, "10")) // same invoice, new key
	post(dupKey, canaryBody("inv-ok", 1, "11")) // same key, other payload
	// Malformed requests never reach the domain; paymentsapi's canary test
	// sends them.
	// A crash after reserving: recovery inquires (not found), charges, logs.
	e.svc.afterReserve = func(Payment) error { return errCrash }
	post(newKey(), canaryBody("inv-crash", 1, "10"))
	e.svc.afterReserve = nil
	e.clk.Advance(time.Minute)
	if _, err := e.svc.RecoverOnce(ctx); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(time.Hour)
	if _, err := e.svc.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if p := e.payment(opOf(t, unknown)); p.Status != StatusCompleted {
		t.Fatalf("reconcile left the unknown payment %s", p.Status)
	}
	if _, err := e.svc.PruneOnce(ctx); err != nil {
		t.Fatal(err)
	}
	// The owner's view is masked, not clear.
	if g := e.get(opOf(t, unknown).String()); g.status != 200 || !strings.Contains(string(g.body), "customer") {
		t.Fatalf("GET: %d %s", g.status, g.body)
	} else {
		answers = append(answers, string(g.body))
	}

	if found := leaks(strings.Join(answers, "\n")); len(found) > 0 {
		t.Errorf("answers carry the canary %q:\n%s", found, strings.Join(answers, "\n"))
	}
	if !strings.Contains(logs.String(), "payments:") {
		t.Fatalf("no service log line was captured; the test would prove nothing:\n%s", logs.String())
	}
	if found := leaks(logs.String()); len(found) > 0 {
		t.Errorf("log lines carry the canary %q:\n%s", found, logs.String())
	}
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if !strings.Contains(rec.Body.String(), "sluice_payments_total") {
		t.Fatalf("metrics text lacks the payments metrics:\n%s", rec.Body.String())
	}
	if found := leaks(rec.Body.String()); len(found) > 0 {
		t.Errorf("/metrics carries the canary %q", found)
	}

	// Everything the database holds, as text, minus the encrypted customer
	// envelopes; the envelopes themselves must not be clear either.
	var dump string
	if err := e.pool.QueryRow(ctx, `
		SELECT concat_ws(E'\n',
		  (SELECT string_agg(concat_ws(' ', event_type, payload::text, headers::text, last_error), E'\n') FROM outbox_event),
		  (SELECT string_agg(concat_ws(' ', request_hash, response_body::text), E'\n') FROM idempotency_record),
		  (SELECT string_agg((to_jsonb(p) - 'customer' - 'customer_email_bidx' - 'customer_tax_id_bidx')::text || ' ' || encode(coalesce(customer_email_bidx, ''), 'escape') || ' ' || encode(coalesce(customer_tax_id_bidx, ''), 'escape'), E'\n') FROM payment p),
		  (SELECT string_agg(customer::text, E'\n') FROM payment),
		  (SELECT string_agg(to_jsonb(l)::text, E'\n') FROM ledger_entry l))`).Scan(&dump); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(dump, EventUnknown) || !strings.Contains(dump, `"customer"`) {
		t.Fatalf("the dump lacks the events it should check:\n%s", dump)
	}
	if found := leaks(dump); len(found) > 0 {
		t.Errorf("the database carries the canary in clear %q:\n%s", found, dump)
	}
	// The envelopes are the real data, not a placeholder: the payment's,
	// bound to the payment, and the requested event's, bound to the event.
	p := e.payment(opOf(t, unknown))
	if got, err := e.kr.Open(CustomerPlace(p.OperationID), "email", p.Customer["email"]); err != nil || got != canaryEmail {
		t.Fatalf("the stored email envelope opens to %q (%v)", got, err)
	}
	var evID uuid.UUID
	var payload []byte
	if err := e.pool.QueryRow(ctx, `SELECT id, payload FROM outbox_event WHERE aggregate_id = $1 AND event_type = $2`,
		p.OperationID.String(), EventRequested).Scan(&evID, &payload); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{"customer.name": canaryName, "customer.email": canaryEmail, "customer.tax_id": canaryTaxID} {
		got, err := pii.OpenPayloadField(e.kr, EventRequested, evID.String(), payload, path)
		if err != nil || string(got) != `"`+want+`"` {
			t.Fatalf("the event's %s opens to %s (%v)", path, got, err)
		}
	}
	var created int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM payment`).Scan(&created); err != nil || created < 4 {
		t.Fatalf("payments created: %d %v", created, err)
	}
	if found := search(t, e, pii.FieldTaxID, " 987-654 321 09 "); len(found) != created {
		t.Fatalf("search by the canary's tax id found %d payments, want the %d created", len(found), created)
	}
}
