package web

import (
	"errors"
	"net/url"
	"testing"

	"github.com/sluice-dev/sluice/internal/payments"
)

// An amount the payments filter refuses is answered with the same amount
// spelled as the filter reads it: "12,50" never gets "write 125.50".
func TestAmountFilterSuggestsTheSameAmount(t *testing.T) {
	t.Parallel()
	for typed, want := range map[string]string{
		"12,50":     `Amount from "12,50" is not an amount: write 12.50 (a dot before the cents, no thousands separators).`,
		"12,5":      `Amount from "12,5" is not an amount: write 12.5 (a dot before the cents, no thousands separators).`,
		"1.234,56":  `Amount from "1.234,56" is not an amount: write 1234.56 (a dot before the cents, no thousands separators).`,
		"1,234.56":  `Amount from "1,234.56" is not an amount: write 1234.56 (a dot before the cents, no thousands separators).`,
		"1 234,56":  `Amount from "1 234,56" is not an amount: write 1234.56 (a dot before the cents, no thousands separators).`,
		"1,234,567": `Amount from "1,234,567" is not an amount: write 1234567 (a dot before the cents, no thousands separators).`,
		"1,234":     `Amount from "1,234" is not an amount: write 1234 or 1.234 (a dot before the cents, no thousands separators).`,
		"12,5,0":    `Amount from "12,5,0" is not an amount: write digits with a dot before the cents, no thousands separators, as 12.50.`,
		"1.2.3":     `Amount from "1.2.3" is not an amount: write digits with a dot before the cents, no thousands separators, as 12.50.`,
		"abc":       `Amount from "abc" is not an amount: write digits with a dot before the cents, no thousands separators, as 12.50.`,
		"1.234,5,6": `Amount from "1.234,5,6" is not an amount: write digits with a dot before the cents, no thousands separators, as 12.50.`,
	} {
		_, err := parsePaymentForm(url.Values{"amount_min": {typed}})
		if !errors.Is(err, payments.ErrInvalidFilter) {
			t.Errorf("%q: %v, want an invalid filter", typed, err)
			continue
		}
		if got := paymentProblem(err); got != want {
			t.Errorf("%q:\n got %s\nwant %s", typed, got, want)
		}
	}
	// The spelling it suggests is accepted, as the same amount.
	f, err := parsePaymentForm(url.Values{"amount_min": {"12.50"}})
	if err != nil || f.filter.AmountMin.String() != "12.5" {
		t.Errorf("12.50: %v %s", err, f.filter.AmountMin)
	}
}
