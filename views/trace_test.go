package views

import (
	"testing"
	"time"
)

func TestLag(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0:                        "+0\u00a0µs",
		312 * time.Microsecond:   "+312\u00a0µs",
		26900 * time.Microsecond: "+26.9\u00a0ms",
		2340 * time.Millisecond:  "+2.34\u00a0s",
		-5 * time.Millisecond:    "−5.0\u00a0ms",
	} {
		if got := Lag(d); got != want {
			t.Errorf("Lag(%s) = %q, want %q", d, got, want)
		}
	}
	if got := Lag(3 * time.Minute); got == "" || got[0] != '+' {
		t.Errorf("Lag(3m) = %q", got)
	}
}
