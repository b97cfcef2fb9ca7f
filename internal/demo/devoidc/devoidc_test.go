package devoidc

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

func TestBindsToLoopbackOnly(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:0", "localhost:0"} {
		if s, err := Start(context.Background(), Config{Addr: addr, ClientID: "c", ClientSecret: "s", RedirectURIs: []string{"http://127.0.0.1:1/cb"}}); err == nil {
			s.Close()
			t.Errorf("listened on %s", addr)
		}
	}
}

func TestDiscoveryAndLoginForm(t *testing.T) {
	s, err := Start(context.Background(), Config{Addr: "127.0.0.1:0", ClientID: "c", ClientSecret: "s",
		RedirectURIs: []string{"http://127.0.0.1:1/cb"}, PostLogoutURIs: []string{"http://127.0.0.1:1/out"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	resp, err := http.Get(s.Issuer() + "/.well-known/openid-configuration")
	if err != nil {
		t.Fatal(err)
	}
	var disc map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&disc)
	resp.Body.Close()
	for _, k := range []string{"authorization_endpoint", "token_endpoint", "jwks_uri", "end_session_endpoint"} {
		if v, _ := disc[k].(string); !strings.HasPrefix(v, s.Issuer()) {
			t.Errorf("discovery %s = %v", k, disc[k])
		}
	}
	if disc["issuer"] != s.Issuer() {
		t.Fatalf("issuer %v", disc["issuer"])
	}
	// The sign-in page runs no script, and leaves form-action open: browsers
	// apply it to the redirect back to the console after sign-in.
	resp, err = http.Get(s.Issuer() + "/login?authRequestID=x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") ||
		strings.Contains(csp, "script-src") || strings.Contains(csp, "form-action") {
		t.Errorf("sign-in page CSP = %q", csp)
	}
	// A wrong password does not complete the request.
	form := url.Values{"id": {"unknown"}, "username": {"admin"}, "password": {"admin"}}
	resp, err = http.PostForm(s.Issuer()+"/login", form)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("unknown request: %d", resp.StatusCode)
	}
	s.store.requests["r1"] = &authRequest{id: "r1"}
	if err := s.store.checkLogin("r1", "admin", "wrong"); err == nil || s.store.requests["r1"].done {
		t.Fatal("wrong password accepted")
	}
	if err := s.store.checkLogin("r1", "admin", "admin"); err != nil || !s.store.requests["r1"].done {
		t.Fatalf("right password refused: %v", err)
	}
}
