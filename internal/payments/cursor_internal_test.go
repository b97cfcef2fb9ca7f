package payments

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
)

// Go's base64 decoder skips line breaks, so a cursor with one inside used to
// decode to the same position: one cursor, one spelling.
func TestListCursorWithALineBreakIsRefused(t *testing.T) {
	t.Parallel()
	f := Filter{Status: StatusUnknown}
	want := cursor{segment: 1, at: time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC), op: uuid.New()}
	c := encodeListCursor(f, want)
	if got, err := decodeListCursor(f, c); err != nil || got != want {
		t.Fatalf("the cursor itself: %+v, %v", got, err)
	}
	for _, bad := range []string{c[:5] + "\n" + c[5:], c[:5] + "\r\n" + c[5:], c + "\n"} {
		if _, err := decodeListCursor(f, bad); !errors.Is(err, ErrInvalidCursor) {
			t.Errorf("%q: %v, want ErrInvalidCursor", bad, err)
		}
	}
}
