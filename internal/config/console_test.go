package config

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

func parseConsole(t *testing.T, env map[string]string) (Console, error) {
	t.Helper()
	base := map[string]string{
		"DATABASE_URL": "postgres://x@127.0.0.1/db", "OIDC_ISSUER": "https://idp.example", "OIDC_CLIENT_ID": "c",
		"OIDC_CLIENT_SECRET": "s", "CONSOLE_ROLE_MAP": "sre:admin",
	}
	for k, v := range env {
		base[k] = v
	}
	var c Console
	f := NewFlags("serve", "", MapLookup(base), io.Discard)
	c.Register(f)
	if err := f.Parse(nil); err != nil {
		return c, err
	}
	return c, c.Validate()
}

func TestConsoleDoorDefaults(t *testing.T) {
	t.Parallel()
	c, err := parseConsole(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Scopes()) != 0 || c.RoleRecheck != 5*time.Minute || c.ReadHeaderTimeout != 10*time.Second || c.ReadTimeout != 30*time.Second ||
		c.IdleTimeout != 2*time.Minute || c.WSPerSession != 8 || c.LoginRate != 60 || c.LoginPending != 10000 {
		t.Fatalf("defaults %+v", c)
	}
	c, err = parseConsole(t, map[string]string{"OIDC_SCOPES": "openid profile,groups"})
	if err != nil || !slices.Equal(c.Scopes(), []string{"openid", "profile", "groups"}) {
		t.Fatalf("OIDC_SCOPES: %v %v", c.Scopes(), err)
	}
}

func TestConsoleDoorSettingsNameTheVariable(t *testing.T) {
	t.Parallel()
	for want, env := range map[string]map[string]string{
		"OIDC_SCOPES":                 {"OIDC_SCOPES": "profile email"},
		"OIDC_SCOPES: \"a\\\"b\"":     {"OIDC_SCOPES": `openid a"b`},
		"CONSOLE_ROLE_RECHECK":        {"CONSOLE_ROLE_RECHECK": "0s"},
		"CONSOLE_READ_HEADER_TIMEOUT": {"CONSOLE_READ_HEADER_TIMEOUT": "-1s"},
		"CONSOLE_READ_TIMEOUT":        {"CONSOLE_READ_TIMEOUT": "soon"},
		"CONSOLE_IDLE_TIMEOUT":        {"CONSOLE_IDLE_TIMEOUT": "0s"},
		"CONSOLE_WS_PER_SESSION":      {"CONSOLE_WS_PER_SESSION": "0"},
		"CONSOLE_LOGIN_RATE":          {"CONSOLE_LOGIN_RATE": "-5"},
		"CONSOLE_LOGIN_PENDING_MAX":   {"CONSOLE_LOGIN_PENDING_MAX": "lots"},
	} {
		_, err := parseConsole(t, env)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("env %v: err = %v, want one naming %s", env, err, want)
		}
	}
}

// The loopback rule (auth.CheckPlainHTTPOnLoopback) applies to both URLs
// the sign-in trusts, for serve and for the demo alike.
func TestPlainHTTPOnlyOnLoopback(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		want string // "" = accepted
	}{
		{map[string]string{"CONSOLE_PUBLIC_URL": "http://LOCALHOST:8080"}, ""},
		{map[string]string{"CONSOLE_PUBLIC_URL": "http://[::1]:8080", "OIDC_ISSUER": "http://127.0.0.2:9000"}, ""},
		{map[string]string{"CONSOLE_PUBLIC_URL": "https://console.example.com"}, ""},
		{map[string]string{"CONSOLE_PUBLIC_URL": "http://console.example.com"}, "CONSOLE_PUBLIC_URL: plain http is only allowed on loopback"},
		{map[string]string{"OIDC_ISSUER": "http://idp.example.com"}, "OIDC_ISSUER: plain http is only allowed on loopback"},
	} {
		_, err := parseConsole(t, tc.env)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("serve %v: %v, want accepted", tc.env, err)
		case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
			t.Errorf("serve %v: %v, want %q", tc.env, err, tc.want)
		}
	}
	if _, err := parseDemo([]string{"--console-addr", "0.0.0.0:8080"}, MapLookup(nil)); err == nil || !strings.Contains(err.Error(), "CONSOLE_PUBLIC_URL: plain http") {
		t.Errorf("demo on all interfaces without an https public URL: %v", err)
	}
}

// The console writes payment.* events (resolutions, approvals, settlement
// lines) on PAYMENTS_TOPIC, as payments-api does: one variable, read by
// both, so a deployment that moves the topic moves it for both.
func TestConsoleReadsThePaymentsTopic(t *testing.T) {
	t.Parallel()
	c, err := parseConsole(t, nil)
	if err != nil || c.PaymentsTopic != "sluice.payments" {
		t.Fatalf("default: %q %v", c.PaymentsTopic, err)
	}
	c, err = parseConsole(t, map[string]string{"PAYMENTS_TOPIC": "acme.payments"})
	if err != nil || c.PaymentsTopic != "acme.payments" {
		t.Fatalf("PAYMENTS_TOPIC: %q %v", c.PaymentsTopic, err)
	}
	var p PaymentsAPI
	f := NewFlags("payments-api", "", MapLookup(map[string]string{"PAYMENTS_TOPIC": "acme.payments"}), io.Discard)
	p.Register(f)
	if err := f.Parse(nil); err != nil || p.Topic != c.PaymentsTopic {
		t.Fatalf("payments-api reads %q from the same variable (%v)", p.Topic, err)
	}
}
