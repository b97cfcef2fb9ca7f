package audit

import (
	"errors"
	"testing"
)

// Go's base64 decoder skips line breaks, so a cursor with one inside used to
// decode to the same position: one cursor, one spelling.
func TestCursorWithALineBreakIsRefused(t *testing.T) {
	t.Parallel()
	f := Filter{Action: "outbox.retry"}
	c := encodeCursor(f, 42)
	if seq, err := decodeCursor(f, c); err != nil || seq != 42 {
		t.Fatalf("the cursor itself: %d, %v", seq, err)
	}
	for _, bad := range []string{c[:5] + "\n" + c[5:], c[:5] + "\r\n" + c[5:], c + "\n"} {
		if _, err := decodeCursor(f, bad); !errors.Is(err, ErrInvalidCursor) {
			t.Errorf("%q: %v, want ErrInvalidCursor", bad, err)
		}
	}
}
