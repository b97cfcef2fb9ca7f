package web_test

import (
	"context"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"
	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
	"github.com/sluice-dev/sluice/web"
)

// A payment's page says, in plain words for support staff, what its status
// means for the money, that the customer's values are masked and who may
// reveal them (from CONSOLE_REVEAL_ROLES), and counts the inquiries the
// provider calls list shows: an inquiry that settled the payment was left
// out of the old count ("2 attempts" beside three inquiries).
func TestPaymentPageSaysWhatStatusMaskAndInquiriesMean(t *testing.T) {
	t.Parallel()
	kr := testKeyring(t, "k1")
	h := start(t, options{keyring: kr})
	op := uuid.Must(uuid.NewV7())
	email, err := kr.Seal(payments.CustomerPlace(op), "email", canaryEmail)
	if err != nil {
		t.Fatal(err)
	}
	acc := paymentstest.Account(t, h.pool, paymentstest.AccountOpts{ID: 41, Balance: "1000"})
	paymentstest.Payment(t, h.pool, paymentstest.PaymentOpts{Account: acc, OperationID: op, Customer: map[string]string{"email": email}})
	// Two inquiries without an answer (counted in inquiry_attempts), then
	// one that succeeded (the payment is still unknown here: the counts,
	// not the resolution, are under test).
	if _, err := h.pool.Exec(context.Background(), `
		UPDATE payment SET inquiry_attempts = 2, last_inquiry_at = now(), last_inquiry_answer = 'succeeded' WHERE operation_id = $1;`, op); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(context.Background(), `
		INSERT INTO payment_provider_call (operation_id, op, started_at, duration_us, answer, error)
		VALUES ($1, 'charge', now() - interval '9 minutes', 5000000, NULL, 'timeout'),
		       ($1, 'inquire', now() - interval '8 minutes', 5000000, NULL, 'timeout'),
		       ($1, 'inquire', now() - interval '5 minutes', 12000, 'unknown', NULL),
		       ($1, 'inquire', now() - interval '1 minute', 12000, 'succeeded', NULL)`, op); err != nil {
		t.Fatal(err)
	}
	support, _ := h.signedIn(t, "support")
	_, page := support.get(t, h.base+"/payments/"+op.String(), "text/html")
	d := doc(t, page)
	if got := squashed(d.Find(`[data-testid="status-meaning"]`)); !strings.HasPrefix(got, "The provider has not told us whether it charged.") ||
		!strings.Contains(got, "never becomes failed by itself") {
		t.Errorf("status meaning %q", got)
	}
	if got := squashed(d.Find(`[data-testid="inquiries"]`)); !strings.Contains(got, "succeeded · 3 inquiries, listed under Provider calls") {
		t.Errorf("inquiries %q, want the three the calls list shows", got)
	}
	if n := d.Find(`[data-testid="provider-call"]`).FilterFunction(func(_ int, s *goquery.Selection) bool {
		return strings.Contains(s.Text(), "inquire")
	}).Length(); n != 3 {
		t.Errorf("the calls list shows %d inquiries", n)
	}
	value := d.Find(`[data-testid="customer-value"]`)
	if value.AttrOr("title", "") != "masked" || !strings.Contains(squashed(value.Parent()), "(masked)") {
		t.Errorf("the masked value is not labelled: %q", squashed(value.Parent()))
	}
	if got := squashed(d.Find(`[data-testid="customer-masked"]`)); got != "Masked: part of each value is hidden. Operators and admins can reveal one, with a reason; it is recorded." {
		t.Errorf("support reads %q", got)
	}
	oncall, _ := h.signedIn(t, "oncall")
	_, page = oncall.get(t, h.base+"/payments/"+op.String(), "text/html")
	if got := squashed(doc(t, page).Find(`[data-testid="customer-masked"]`)); !strings.Contains(got, "Reveal one under Sealed personal data") {
		t.Errorf("on-call reads %q", got)
	}

	// Who may reveal is the configuration's, not a fixed sentence.
	h2 := start(t, options{keyring: kr, configure: func(c *web.Config) { c.RevealRoles = []auth.Role{auth.RoleAdmin} }})
	acc2 := paymentstest.Account(t, h2.pool, paymentstest.AccountOpts{ID: 42, Balance: "1000"})
	paymentstest.Payment(t, h2.pool, paymentstest.PaymentOpts{Account: acc2, OperationID: op, Customer: map[string]string{"email": email}})
	oncall2, _ := h2.signedIn(t, "oncall")
	_, page = oncall2.get(t, h2.base+"/payments/"+op.String(), "text/html")
	if got := squashed(doc(t, page).Find(`[data-testid="customer-masked"]`)); !strings.Contains(got, "Admins can reveal one, with a reason") {
		t.Errorf("with admins alone revealing, on-call reads %q", got)
	}
}
