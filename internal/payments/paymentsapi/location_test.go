package paymentsapi_test

import (
	"testing"
)

// A created (201) or accepted (202) payment names where it is read, on
// the first answer and on a replay alike; an error names nothing.
func TestCreatedPaymentsNameTheirLocation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "1000")
	key := newKey()
	first := e.post(key, payBody("inv-loc", 1, "10"))
	if first.status != 201 {
		t.Fatalf("pay: %d %s", first.status, first.body)
	}
	want := "/v1/payments/" + opOf(t, first).String()
	if got := first.header.Get("Location"); got != want {
		t.Fatalf("Location %q, want %q", got, want)
	}
	again := e.post(key, payBody("inv-loc", 1, "10"))
	if again.header.Get("Idempotent-Replayed") != "true" || again.header.Get("Location") != want {
		t.Fatalf("replay: Location %q, replayed %q", again.header.Get("Location"), again.header.Get("Idempotent-Replayed"))
	}
	if g := e.get(opOf(t, first).String()); g.status != 200 {
		t.Fatalf("GET the Location: %d", g.status)
	}
	bad := e.post(newKey(), payBody("inv-loc-2", 1, "-1"))
	if bad.status != 422 || bad.header.Get("Location") != "" {
		t.Fatalf("an error names a location: %d %q", bad.status, bad.header.Get("Location"))
	}
}
