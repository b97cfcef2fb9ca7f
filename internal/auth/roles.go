// Package auth is the console's door: the OIDC relying party (code flow with
// PKCE, one-time state, nonce), server-side sessions, roles and permissions,
// CSRF tokens and the echo middleware that enforces them on every route.
package auth

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"
)

// Role is a console role. Roles come from the provider's roles claim through
// an explicit map (CONSOLE_ROLE_MAP); nothing else grants one.
type Role string

// The four roles of DESIGN.md.
const (
	RoleViewer   Role = "viewer"   // support
	RoleOperator Role = "operator" // on-call
	RoleAuditor  Role = "auditor"
	RoleAdmin    Role = "admin"
)

// Permission is one thing a role may do. Routes declare the permission they
// need; the middleware checks it. This file is the only place that says
// which role has which permission.
type Permission string

// Permissions of DESIGN.md's table.
const (
	PermView        Permission = "view"         // dashboards, outbox, payments, inbox (masked)
	PermOutboxAct   Permission = "outbox.act"   // retry / dead-letter, bulk
	PermPaymentsAct Permission = "payments.act" // inquire / resolve payments
	PermAudit       Permission = "audit"        // see and export audit, verify chain
	PermRevealPII   Permission = "pii.reveal"   // reveal a PII field (with reason)
)

var rolePermissions = map[Role][]Permission{
	RoleViewer:   {PermView},
	RoleOperator: {PermView, PermOutboxAct, PermPaymentsAct, PermRevealPII},
	RoleAuditor:  {PermView, PermAudit},
	RoleAdmin:    {PermView, PermOutboxAct, PermPaymentsAct, PermAudit, PermRevealPII},
}

// permissionText says what each permission lets a user do, for the page
// that refuses a request for the lack of it.
var permissionText = map[Permission]string{
	PermView:        "view the console",
	PermOutboxAct:   "act on outbox events (retry, dead-letter, discard, bulk jobs, pause and replay)",
	PermPaymentsAct: "act on payments (inquire, resolve, approve, settlement files)",
	PermAudit:       "read, export and verify the audit trail",
	PermRevealPII:   "reveal personal data",
}

// Describe says what p lets a user do, in words.
func (p Permission) Describe() string {
	if s, ok := permissionText[p]; ok {
		return s
	}
	return string(p)
}

// RolesWith lists the roles the fixed table gives p, in a stable order (the
// console's default for settings that name roles, such as who may reveal).
func RolesWith(p Permission) []Role {
	var out []Role
	for _, r := range []Role{RoleViewer, RoleOperator, RoleAuditor, RoleAdmin} {
		if slices.Contains(rolePermissions[r], p) {
			out = append(out, r)
		}
	}
	return out
}

// ParseRoles reads a comma-separated list of role names.
func ParseRoles(s string) ([]Role, error) {
	var out []Role
	for _, part := range strings.Split(s, ",") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		r, err := ParseRole(part)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// ParseRole reads a role name.
func ParseRole(s string) (Role, error) {
	r := Role(strings.TrimSpace(s))
	if _, ok := rolePermissions[r]; !ok {
		return "", fmt.Errorf("%q is not a role (viewer, operator, auditor, admin)", s)
	}
	return r, nil
}

// Can reports whether any of roles grants p.
func Can(roles []Role, p Permission) bool {
	for _, r := range roles {
		if slices.Contains(rolePermissions[r], p) {
			return true
		}
	}
	return false
}

// RoleMap maps provider group (or role) names to console roles.
type RoleMap map[string][]Role

// ParseRoleMap reads CONSOLE_ROLE_MAP: `group:role,...`. A group may appear
// more than once to get several roles.
func ParseRoleMap(s string) (RoleMap, error) {
	m := RoleMap{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		i := strings.LastIndex(part, ":")
		if i <= 0 || i == len(part)-1 {
			return nil, fmt.Errorf("%q is not group:role", part)
		}
		role, err := ParseRole(part[i+1:])
		if err != nil {
			return nil, err
		}
		g := strings.TrimSpace(part[:i])
		if !slices.Contains(m[g], role) {
			m[g] = append(m[g], role)
		}
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("no group:role pairs")
	}
	return m, nil
}

// Roles maps the claim's groups to roles, sorted and without duplicates.
func (m RoleMap) Roles(groups []string) []Role {
	var out []Role
	for _, g := range groups {
		for _, r := range m[g] {
			if !slices.Contains(out, r) {
				out = append(out, r)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// groupsFromClaim reads a roles claim that is a list of strings or one
// string; anything else counts as no groups.
func groupsFromClaim(v any) []string {
	switch x := v.(type) {
	case string:
		return []string{x}
	case []any:
		var out []string
		for _, e := range x {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

func roleStrings(roles []Role) []string {
	out := make([]string, len(roles))
	for i, r := range roles {
		out[i] = string(r)
	}
	return out
}

// SafeNext returns next when it is a same-origin relative path, else "/".
// It refuses invalid UTF-8, scheme-relative (`//evil`), backslash (`/\evil`, browsers read
// it as `//`), scheme (`https:evil`) and control-character tricks.
func SafeNext(next string) string {
	if next == "" || len(next) > 2048 || next[0] != '/' || !utf8.ValidString(next) {
		// Invalid UTF-8 (`/%ff`) is no path of ours, and PostgreSQL
		// refuses it in a text column.
		return "/"
	}
	if len(next) > 1 && (next[1] == '/' || next[1] == '\\') {
		return "/"
	}
	for _, c := range next {
		if c < 0x20 || c == 0x7f || c == '\\' {
			return "/"
		}
	}
	return next
}
