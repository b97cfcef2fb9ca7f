package web

import (
	"errors"
	"net/url"
	"testing"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/payments"
)

// FuzzListForms (SECURITY.md case 14): whatever a list page's query holds,
// its parser never panics and either accepts it or refuses it with an
// error the page explains as a 400 (a filter or a cursor it cannot read),
// never one that would be a 500.
func FuzzListForms(f *testing.F) {
	for _, seed := range []string{
		"status=dead&topic=orders&created_from=2025-01-31T13:45&sort=oldest",
		"created_to=2025-13-45&after=" + string(make([]byte, 70)),
		"amount_min=1e999999999&amount_max=-0.5&operation_id=not-a-uuid",
		"actor=%00&from=2025-01-01&to=yesterday&outcome=ok",
		"id_prefix=zz&aggregate_id=x&sort=sideways",
		"status=%ff%fe",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return // the router answers an unreadable query before a handler
		}
		if _, err := parseListForm(q); err != nil {
			if !errors.Is(err, outbox.ErrInvalidFilter) && !errors.Is(err, outbox.ErrInvalidCursor) {
				t.Fatalf("outbox list %q: %v is not a filter or cursor problem", raw, err)
			}
			if problemText(err) == "" {
				t.Fatalf("outbox list %q: %v has no text for the page", raw, err)
			}
		}
		if _, err := parseAuditForm(q); err != nil {
			if !errors.Is(err, audit.ErrInvalidFilter) && !errors.Is(err, audit.ErrInvalidCursor) {
				t.Fatalf("audit list %q: %v is not a filter or cursor problem", raw, err)
			}
			if auditProblem(err) == "" {
				t.Fatalf("audit list %q: %v has no text for the page", raw, err)
			}
		}
		if f, problem := parseDiscrepancyListForm(q); problem == "" && len(f.after) > 64 {
			t.Fatalf("discrepancies list %q: a cursor of %d bytes accepted", raw, len(f.after))
		}
		if _, err := parsePaymentForm(q); err != nil {
			if !errors.Is(err, payments.ErrInvalidFilter) && !errors.Is(err, payments.ErrInvalidCursor) {
				t.Fatalf("payments list %q: %v is not a filter or cursor problem", raw, err)
			}
			if paymentProblem(err) == "" {
				t.Fatalf("payments list %q: %v has no text for the page", raw, err)
			}
		}
	})
}
