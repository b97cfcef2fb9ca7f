package auth

import (
	"strings"
	"testing"
)

// SECURITY.md case 7.
func TestSafeNext(t *testing.T) {
	cases := map[string]string{
		"//evil":               "/",
		"//evil.example/x":     "/",
		`/\evil`:               "/",
		`/\/evil`:              "/",
		"https:evil":           "/",
		"https://evil.example": "/",
		"javascript:alert(1)":  "/",
		"evil":                 "/",
		"":                     "/",
		"/ok\r\nSet-Cookie: x": "/",
		"/\tevil":              "/",
		"/\xff":                "/", // invalid UTF-8 (next=/%ff) never reaches PostgreSQL
		"/caf\xc3":             "/",
		"/café":                "/café",
		"/outbox?status=dead":  "/outbox?status=dead",
		"/payments/abc":        "/payments/abc",
		"/":                    "/",
	}
	for in, want := range cases {
		if got := SafeNext(in); got != want {
			t.Errorf("SafeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRoleMapAndPermissions(t *testing.T) {
	m, err := ParseRoleMap("support:viewer, oncall:operator,audit:auditor,sre:admin,sre:auditor")
	if err != nil {
		t.Fatal(err)
	}
	if r := m.Roles([]string{"sre", "unknown"}); len(r) != 2 || r[0] != RoleAdmin || r[1] != RoleAuditor {
		t.Fatalf("roles %v", r)
	}
	if r := m.Roles([]string{"marketing"}); len(r) != 0 {
		t.Fatalf("unmapped group got roles %v", r)
	}
	for _, bad := range []string{"", "support", "support:root", ":viewer", "support:"} {
		if _, err := ParseRoleMap(bad); err == nil {
			t.Errorf("ParseRoleMap(%q) accepted", bad)
		}
	}
	want := map[Role][]Permission{
		RoleViewer:   {PermView},
		RoleOperator: {PermView, PermOutboxAct, PermPaymentsAct, PermRevealPII},
		RoleAuditor:  {PermView, PermAudit},
		RoleAdmin:    {PermView, PermOutboxAct, PermPaymentsAct, PermAudit, PermRevealPII},
	}
	all := []Permission{PermView, PermOutboxAct, PermPaymentsAct, PermAudit, PermRevealPII}
	for role, perms := range want {
		for _, p := range all {
			has := false
			for _, q := range perms {
				has = has || q == p
			}
			if Can([]Role{role}, p) != has {
				t.Errorf("%s %s: got %v, DESIGN.md says %v", role, p, !has, has)
			}
		}
	}
	if Can(nil, PermView) {
		t.Fatal("no role may do anything")
	}
}

func TestCookieSpec(t *testing.T) {
	cs, err := NewCookieSpec("https://console.example")
	if err != nil || cs.Session != "__Host-sluice" || !cs.Secure {
		t.Fatalf("%+v %v", cs, err)
	}
	c := cs.SessionCookie("v")
	if !c.HttpOnly || !c.Secure || c.Path != "/" || c.Domain != "" || c.SameSite != 2 {
		t.Fatalf("cookie %+v", c)
	}
	if cs, err = NewCookieSpec("http://127.0.0.1:8080"); err != nil || cs.Session != "sluice_session" || cs.Secure {
		t.Fatalf("%+v %v", cs, err)
	}
	if _, err := NewCookieSpec("http://console.example"); err == nil {
		t.Fatal("plain http off loopback accepted")
	}
}

// OIDC_SCOPES: as given when set; otherwise openid plus the optional scopes
// the provider lists, and never one it does not list.
func TestChooseScopes(t *testing.T) {
	cases := []struct {
		configured, supported, want []string
	}{
		{nil, nil, []string{"openid", "profile", "email"}},
		{nil, []string{"openid", "profile", "email"}, []string{"openid", "profile", "email"}},
		{nil, []string{"openid", "profile", "email", "groups", "offline_access", "phone"}, []string{"openid", "profile", "email", "groups", "offline_access"}},
		{nil, []string{"openid", "email", "offline_access"}, []string{"openid", "email", "offline_access"}}, // Entra-like: no groups scope
		{[]string{"openid", "roles"}, []string{"openid", "profile"}, []string{"openid", "roles"}},
	}
	for _, c := range cases {
		if got := ChooseScopes(c.configured, c.supported); strings.Join(got, " ") != strings.Join(c.want, " ") {
			t.Errorf("ChooseScopes(%v, %v) = %v, want %v", c.configured, c.supported, got, c.want)
		}
	}
}
