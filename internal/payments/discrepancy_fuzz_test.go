package payments

import (
	"errors"
	"testing"
	"time"
)

// FuzzDiscrepancyCursor (SECURITY.md case 14): whatever a page link's
// cursor holds, reading it never panics; it is a position of the list it
// was asked for (and writes back to the same text), or ErrInvalidCursor,
// which the page explains as a 400.
func FuzzDiscrepancyCursor(f *testing.F) {
	f.Add(encodeDiscrepancyCursor(false, time.Date(2026, 5, 1, 12, 0, 0, 123000, time.UTC), 7), false)
	f.Add(encodeDiscrepancyCursor(true, time.Unix(0, 0), 1), false)
	f.Add("", true)
	f.Add("AQEAAAAAAAAAAAAAAAAAAAAA", true)
	f.Add("%%%", false)
	f.Fuzz(func(t *testing.T, token string, closed bool) {
		at, id, err := decodeDiscrepancyCursor(closed, token)
		if err != nil {
			if !errors.Is(err, ErrInvalidCursor) {
				t.Fatalf("%q: %v is not ErrInvalidCursor", token, err)
			}
			return
		}
		if id <= 0 {
			t.Fatalf("%q: id %d accepted", token, id)
		}
		if again := encodeDiscrepancyCursor(closed, at, id); again != token {
			t.Fatalf("%q reads as (%s, %d), which writes %q", token, at, id, again)
		}
	})
}
