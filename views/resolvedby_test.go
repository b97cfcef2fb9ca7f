package views

import (
	"testing"

	"github.com/sluice-dev/sluice/internal/payments"
)

// Who resolved a payment reads as names where the page knows them, and as
// the stored ids where it does not.
func TestResolvedByNamesTheStaff(t *testing.T) {
	names := StaffNames{}
	names.AddApprovals([]payments.Approval{{RequestedBy: "https://idp|u1", RequesterName: "oncall", DecidedBy: "https://idp|u2", DeciderName: "admin"}})
	names.Add("https://idp", "u3", "ayse")
	for _, c := range []struct{ by, settledBy, want, whom string }{
		{"operator:https://idp|u3", "", "operator ayse", "an operator"},
		{"operator:https://idp|u1 approved by https://idp|u2", "", "operator oncall, approved by admin", "an operator"},
		{"operator:https://idp|u9", "", "operator https://idp|u9", "an operator"},
		{"settlement:console sha256:8a8f", "admin", "settlement file console sha256:8a8f, applied by admin", "a settlement file"},
		{"settlement:psp-2026-12-07.csv", "", "settlement file psp-2026-12-07.csv", "a settlement file"},
		{"inquiry", "", "inquiry", "inquiry"},
	} {
		if got := ResolvedBy(c.by, names, c.settledBy); got != c.want {
			t.Errorf("ResolvedBy(%q) = %q, want %q", c.by, got, c.want)
		}
		if got := ResolvedByWhom(c.by); got != c.whom {
			t.Errorf("ResolvedByWhom(%q) = %q, want %q", c.by, got, c.whom)
		}
	}
}
