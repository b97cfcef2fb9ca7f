package web_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
	"github.com/sluice-dev/sluice/internal/pii"
	"github.com/sluice-dev/sluice/web"
)

const (
	canaryName  = "Zebulon Quackenbush"
	canaryEmail = "zebulon.quackenbush@canary.example"
)

func testKeyring(t *testing.T, kid string) *pii.Keyring {
	t.Helper()
	keys, blind, err := pii.GenerateSpec(kid)
	if err != nil {
		t.Fatal(err)
	}
	kr, err := pii.ParseKeyring(keys, blind)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// sealedPaymentEvent writes a payment.requested.v1 event whose customer
// fields are sealed under kr, as the payments service writes them.
func sealedPaymentEvent(t *testing.T, h *harness, kr *pii.Keyring) uuid.UUID {
	t.Helper()
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	clear, _ := json.Marshal(map[string]any{"operation_id": id.String(), "amount": "10.00", "currency": "TRY",
		"customer": map[string]string{"name": canaryName, "email": canaryEmail}})
	sealed, err := pii.SealPayload(kr, "payment.requested.v1", id.String(), clear)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := db.WithTx(ctx, h.pool, func(tx pgx.Tx) error {
		_, err := outbox.Insert(ctx, tx, outbox.Event{ID: id, AggregateType: "payment", AggregateID: id.String(),
			Topic: "payments", EventType: "payment.requested.v1", Payload: sealed})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return id
}

// SECURITY.md case 12 and invariant 13: a sealed value is masked on the
// page; a reveal needs the permission and a reason, returns one field with
// no-store, writes its own audit row (never the value), and is rate-limited.
func TestRevealOneSealedField(t *testing.T) {
	t.Parallel()
	kr := testKeyring(t, "k1")
	h := start(t, options{keyring: kr})
	id := sealedPaymentEvent(t, h, kr)

	op, token := h.signedIn(t, "oncall")
	_, page := op.get(t, h.base+"/outbox/"+id.String(), "text/html")
	d := doc(t, page)
	if strings.Contains(page, canaryName) || strings.Contains(page, canaryEmail) {
		t.Fatal("the event page carries a sealed value in clear")
	}
	if got := d.Find(`[data-testid="payload"]`).Text(); !strings.Contains(got, `"amount": "10.00"`) || !strings.Contains(got, "Z***") {
		t.Errorf("payload %q: want the amount in clear and the name masked", got)
	}
	var fields []string
	d.Find(`[data-testid="reveal-form"] input[name="field"]`).Each(func(_ int, s *goquery.Selection) { fields = append(fields, s.AttrOr("value", "")) })
	if strings.Join(fields, ",") != "customer.email,customer.name" {
		t.Fatalf("reveal forms for %v, want customer.email and customer.name", fields)
	}
	reveal := func(b *browser, token, reason string) (*http.Response, string) {
		return b.postForm(t, h.base+"/pii/reveal", token, url.Values{"target_type": {"outbox_event"}, "target_id": {id.String()},
			"field": {"customer.email"}, "reason": {reason}})
	}

	// No reason: refused and audited, nothing shown.
	resp, body := reveal(op, token, "  ")
	if resp.StatusCode != http.StatusForbidden || strings.Contains(body, canaryEmail) {
		t.Fatalf("reveal without a reason: %d %q", resp.StatusCode, body)
	}
	if n := h.countAudit(t, `action = 'pii.reveal' AND outcome = 'denied' AND error_code = 'no_reason'`); n != 1 {
		t.Fatalf("%d denial rows for the reveal without a reason, want 1", n)
	}
	// No permission: a viewer sees no form, and the server refuses anyway.
	sup, stoken := h.signedIn(t, "support")
	_, spage := sup.get(t, h.base+"/outbox/"+id.String(), "text/html")
	if doc(t, spage).Find(`[data-testid="reveal-form"]`).Length() != 0 {
		t.Error("a viewer is offered a reveal")
	}
	if resp, body := reveal(sup, stoken, "curious"); resp.StatusCode != http.StatusForbidden || strings.Contains(body, canaryEmail) {
		t.Fatalf("a viewer's reveal: %d %q", resp.StatusCode, body)
	}

	// Both: one value, no-store, one audit row without the value.
	resp, body = reveal(op, token, "customer asked to confirm their address")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, canaryEmail) || strings.Contains(body, canaryName) {
		t.Fatalf("reveal: %d %q, want the email only", resp.StatusCode, body)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("Cache-Control %q, want no-store", cc)
	}
	if n := h.countAudit(t, `action = 'pii.reveal' AND outcome = 'ok' AND target_id = $1 AND after->>'field' = 'customer.email'`, id.String()); n != 1 {
		t.Fatalf("%d ok reveal rows, want 1", n)
	}
	var leaked int
	if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_event WHERE row_to_json(audit_event)::text LIKE '%' || $1 || '%'`, "canary.example").Scan(&leaked); err != nil || leaked != 0 {
		t.Fatalf("the audit trail carries the revealed value (%d rows, %v)", leaked, err)
	}

	// Rate: ten a minute; the eleventh is refused.
	for i := 2; i <= web.RevealsPerMinute; i++ {
		if resp, _ := reveal(op, token, "case 42"); resp.StatusCode != http.StatusOK {
			t.Fatalf("reveal %d: %d", i, resp.StatusCode)
		}
	}
	if resp, body := reveal(op, token, "case 42"); resp.StatusCode != http.StatusTooManyRequests || strings.Contains(body, canaryEmail) {
		t.Fatalf("reveal %d: %d, want 429", web.RevealsPerMinute+1, resp.StatusCode)
	}
}

// SECURITY.md case 13: a value under a key the console does not hold shows
// as undecryptable, and the page keeps working.
func TestRevealUnderAnUnknownKey(t *testing.T) {
	t.Parallel()
	h := start(t, options{keyring: testKeyring(t, "k2")})
	id := sealedPaymentEvent(t, h, testKeyring(t, "k-lost"))
	op, token := h.signedIn(t, "oncall")
	resp, page := op.get(t, h.base+"/outbox/"+id.String(), "text/html")
	if resp.StatusCode != http.StatusOK || !strings.Contains(doc(t, page).Find(`[data-testid="payload"]`).Text(), pii.Undecryptable) {
		t.Fatalf("event page under a lost key: %d, payload %q", resp.StatusCode, doc(t, page).Find(`[data-testid="payload"]`).Text())
	}
	resp, body := op.postForm(t, h.base+"/pii/reveal", token, url.Values{"target_type": {"outbox_event"}, "target_id": {id.String()},
		"field": {"customer.name"}, "reason": {"support case"}})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, pii.Undecryptable) {
		t.Fatalf("reveal under a lost key: %d %q", resp.StatusCode, body)
	}
}

// A payment's customer fields: masked on its page with the keys, one
// revealed with a reason.
func TestRevealACustomerFieldOfAPayment(t *testing.T) {
	t.Parallel()
	kr := testKeyring(t, "k1")
	h := start(t, options{keyring: kr})
	op := uuid.Must(uuid.NewV7())
	email, err := kr.Seal(payments.CustomerPlace(op), "email", canaryEmail)
	if err != nil {
		t.Fatal(err)
	}
	acc := paymentstest.Account(t, h.pool, paymentstest.AccountOpts{ID: 31, Balance: "1000"})
	paymentstest.Payment(t, h.pool, paymentstest.PaymentOpts{Account: acc, Amount: "20.00", OperationID: op, Customer: map[string]string{"email": email}})
	b, token := h.signedIn(t, "oncall")
	_, page := b.get(t, h.base+"/payments/"+op.String(), "text/html")
	if strings.Contains(page, canaryEmail) || !strings.Contains(page, "z***@c***") {
		t.Fatalf("the payment page should show the email masked, never in clear")
	}
	if doc(t, page).Find(`[data-testid="reveal-form"] input[name="field"][value="email"]`).Length() != 1 {
		t.Fatal("no reveal form for the customer's email")
	}
	resp, body := b.postForm(t, h.base+"/pii/reveal", token, url.Values{"target_type": {"payment"}, "target_id": {op.String()},
		"field": {"email"}, "reason": {"chargeback dispute 77"}})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, canaryEmail) {
		t.Fatalf("reveal: %d %q", resp.StatusCode, body)
	}
	if n := h.countAudit(t, `action = 'pii.reveal' AND outcome = 'ok' AND target_type = 'payment' AND target_id = $1`, op.String()); n != 1 {
		t.Fatalf("%d reveal rows, want 1", n)
	}
}

// Who may reveal is configurable (CONSOLE_REVEAL_ROLES): with admins only,
// on-call gets no form and a refusal (audited); an admin reveals.
func TestRevealRolesAreConfigurable(t *testing.T) {
	t.Parallel()
	kr := testKeyring(t, "k1")
	h := start(t, options{keyring: kr, configure: func(c *web.Config) { c.RevealRoles = []auth.Role{auth.RoleAdmin} }})
	id := sealedPaymentEvent(t, h, kr)
	form := url.Values{"target_type": {"outbox_event"}, "target_id": {id.String()}, "field": {"customer.email"}, "reason": {"case 9"}}
	oncall, token := h.signedIn(t, "oncall")
	_, page := oncall.get(t, h.base+"/outbox/"+id.String(), "text/html")
	if doc(t, page).Find(`[data-testid="reveal-form"]`).Length() != 0 {
		t.Error("on-call is offered a reveal the configuration does not give it")
	}
	if resp, body := oncall.postForm(t, h.base+"/pii/reveal", token, form); resp.StatusCode != http.StatusForbidden || strings.Contains(body, canaryEmail) {
		t.Fatalf("on-call's reveal: %d", resp.StatusCode)
	}
	if n := h.countAudit(t, `action = 'pii.reveal' AND outcome = 'denied' AND error_code = 'permission'`); n != 1 {
		t.Fatalf("%d audited refusals, want 1", n)
	}
	// Permission comes before the form: a user who may not reveal is
	// refused and audited whatever the form holds (it was a bare 400).
	bad := url.Values{"target_type": {"outbox_event"}, "target_id": {"not-an-id"}, "field": {"customer.email"}, "reason": {"case 9"}}
	if resp, _ := oncall.postForm(t, h.base+"/pii/reveal", token, bad); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("on-call's reveal of a form it cannot read: %d, want 403", resp.StatusCode)
	}
	if n := h.countAudit(t, `action = 'pii.reveal' AND outcome = 'denied' AND error_code = 'permission' AND target_id = ''`); n != 1 {
		t.Fatalf("%d audited refusals of the unreadable form, want 1", n)
	}
	admin, atoken := h.signedIn(t, "admin")
	if resp, _ := admin.postForm(t, h.base+"/pii/reveal", atoken, bad); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("admin's reveal of a form it cannot read: %d, want 400", resp.StatusCode)
	}
	if resp, body := admin.postForm(t, h.base+"/pii/reveal", atoken, form); resp.StatusCode != http.StatusOK || !strings.Contains(body, canaryEmail) {
		t.Fatalf("admin's reveal: %d %q", resp.StatusCode, body)
	}
}
