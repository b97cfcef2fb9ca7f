package paymentsapi_test

import (
	"net/http"
	"strings"
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

// Another method on one of the API's paths is a 405 naming the methods
// there are: the route group's catch-all answered 404 not_found, which
// reads as a wrong path to a client looking for its mistake.
func TestOtherMethodsAreNotAllowed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	for _, c := range []struct{ method, path, allow string }{
		{http.MethodPut, "/v1/payments", http.MethodPost},
		{http.MethodDelete, "/v1/payments", http.MethodPost},
		{http.MethodGet, "/v1/payments", http.MethodPost},
		{http.MethodPost, "/v1/payments/0190f3a2-7c1e-7d4b-9a51-1f2e3d4c5b6a", http.MethodGet},
		{http.MethodDelete, "/v1/payments/0190f3a2-7c1e-7d4b-9a51-1f2e3d4c5b6a", http.MethodGet},
	} {
		req := mustRequest(t, c.method, e.srv.URL+c.path)
		req.Header.Set("Authorization", "Bearer "+e.keyOf(e.merchant))
		a := e.do(req)
		if a.status != http.StatusMethodNotAllowed || a.header.Get("Allow") != c.allow || !strings.Contains(string(a.body), `"method_not_allowed"`) {
			t.Errorf("%s %s: %d Allow %q %s, want 405 Allow %s", c.method, c.path, a.status, a.header.Get("Allow"), a.body, c.allow)
		}
	}
	if a := e.do(mustRequest(t, http.MethodPut, e.srv.URL+"/v1/nowhere")); a.status != http.StatusNotFound && a.status != http.StatusUnauthorized {
		t.Errorf("a path the API does not have: %d", a.status)
	}
}

func mustRequest(t *testing.T, method, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}
