package views

import (
	"testing"

	"github.com/sluice-dev/sluice/internal/payments"
)

// A settlement line's result reads in words, never as its code
// (awaiting_approval, not_found were shown raw), in a dry run and applied.
func TestSettlementResultsReadInWords(t *testing.T) {
	for _, code := range []string{payments.LineResolved, payments.LineAgreed, payments.LineDiscrepancy,
		payments.LineProcessing, payments.LineNotFound, payments.LineAwaiting} {
		for _, applied := range []bool{false, true} {
			if w := SettlementResultWords(code, applied); w == "" || w == code {
				t.Errorf("%s (applied %v) reads %q", code, applied, w)
			}
		}
	}
}
