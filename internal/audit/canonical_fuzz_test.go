package audit

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"
)

// FuzzCanonicalIsInjective (SECURITY.md case 14): the chain's hash covers
// canonical(row), so two different rows must never share an encoding, or
// a row could be rewritten into another with the same hash. Each fuzzed
// pair differs in where its bytes fall between fields (the classic
// concatenation ambiguity: "ab"+"c" against "a"+"bc"), in its list of
// roles, and in NULL against empty before/after.
func FuzzCanonicalIsInjective(f *testing.F) {
	f.Add("ab", "c", "a,b", "", true, "a", "bc", "a", "", false)
	f.Add("", "", "", "{}", false, "", "", ",", "{}", true)
	f.Add("x\x00", "y", "r", "null", false, "x", "\x00y", "r", "null", false)
	f.Fuzz(func(t *testing.T, name1, reason1, roles1, before1 string, nil1 bool, name2, reason2, roles2, before2 string, nil2 bool) {
		mk := func(name, reason, roles, before string, isNil bool) *row {
			r := &row{Seq: 7, OccurredAt: time.UnixMicro(1_700_000_000_000_000)}
			r.ActorName, r.Reason, r.Action, r.Outcome = name, reason, "outbox.retry", OutcomeOK
			if roles != "" {
				r.ActorRoles = strings.Split(roles, ",")
			}
			if !isNil {
				r.Before = &before
			}
			return r
		}
		a, b := mk(name1, reason1, roles1, before1, nil1), mk(name2, reason2, roles2, before2, nil2)
		if bytes.Equal(canonical(a), canonical(b)) && !reflect.DeepEqual(a, b) {
			t.Fatalf("two rows share one encoding:\n%+v\n%+v", a, b)
		}
		if !bytes.Equal(chainHash(genesis, a), chainHash(genesis, a)) {
			t.Fatal("the hash of one row changed between two computations")
		}
	})
}
