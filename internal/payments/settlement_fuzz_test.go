package payments

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/google/uuid"
)

// FuzzParseSettlement (SECURITY.md case 14): whatever a file holds, the
// parser never panics and answers one of its three ways. A file it accepts
// has only whole, consistent lines (a real operation id, a known outcome,
// a bounded reference, no operation settled two ways, lines in order) and
// names the exact bytes it read; a refused one names each bad line.
func FuzzParseSettlement(f *testing.F) {
	op := "0190f3a2-7c1e-7d4b-9a51-1f2e3d4c5b6a"
	for _, seed := range []string{
		op + ",succeeded\n",
		"operation_id,outcome,provider_ref\n" + op + ",failed,ref-1\r\n",
		"\xef\xbb\xbf# comment\n\n" + op + ",SUCCEEDED, r \n",
		op + ",succeeded\n" + op + ",failed\n",
		`"` + op + `","failed","a,""b"""` + "\n",
		op + ",maybe\n",
		"\"unterminated\n" + op + ",failed\n",
		"",
		"\x00\xff,\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := ParseSettlement(bytes.NewReader(data))
		var serr *SettlementError
		switch {
		case err == nil:
			sum := sha256.Sum256(data)
			if file.SHA256 != hex.EncodeToString(sum[:]) {
				t.Fatalf("sha256 %s is not the input's", file.SHA256)
			}
			if len(file.Entries) == 0 {
				t.Fatal("accepted a file without entries")
			}
			outcome := map[uuid.UUID]Outcome{}
			last := 0
			for _, e := range file.Entries {
				if e.OperationID == uuid.Nil || (e.Outcome != OutcomeSucceeded && e.Outcome != OutcomeFailed) ||
					len(e.ProviderRef) > 200 || e.Line <= last {
					t.Fatalf("accepted entry %+v (after line %d)", e, last)
				}
				if o, ok := outcome[e.OperationID]; ok && o != e.Outcome {
					t.Fatalf("operation %s accepted as %s and %s", e.OperationID, o, e.Outcome)
				}
				outcome[e.OperationID], last = e.Outcome, e.Line
			}
		case errors.As(err, &serr):
			if len(serr.Problems) == 0 {
				t.Fatal("a refusal that names no line")
			}
			for _, p := range serr.Problems {
				if p.Line < 1 || p.Message == "" {
					t.Fatalf("problem %+v", p)
				}
			}
		case errors.Is(err, ErrEmptySettlement), errors.Is(err, ErrInvalidSettlement):
		default:
			t.Fatalf("unexpected error %v", err)
		}
	})
}
