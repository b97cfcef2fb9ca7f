package pii

import (
	"strings"
	"testing"
)

// Headers show the trace context and message ids; every other value, a
// non-string one and headers that are not an object are redacted. The
// output never carries a redacted value.
func TestMaskHeaders(t *testing.T) {
	for in, want := range map[string]string{
		``:   `{}`,
		`{}`: `{}`,
		`{"traceparent":"00-aa-bb-01","Correlation-ID":"c-1","email":"jane@example.org"}`: `{"Correlation-ID":"c-1","email":"[redacted]","traceparent":"00-aa-bb-01"}`,
		`{"tracestate":{"nested":"jane@example.org"}}`:                                    `{"tracestate":"[redacted]"}`,
		`["jane@example.org"]`: `"[redacted]"`,
		`not json`:             `"[redacted]"`,
	} {
		got := string(MaskHeaders([]byte(in)))
		if got != want {
			t.Errorf("MaskHeaders(%q) = %s, want %s", in, got, want)
		}
		if strings.Contains(got, "jane@") {
			t.Errorf("MaskHeaders(%q) shows a redacted value: %s", in, got)
		}
	}
}
