package web

import (
	"testing"

	"github.com/sluice-dev/sluice/internal/auth"
)

// The refusal names what is lacking, who has it and what the user has, in
// the grammar of the counts (one role, several, none).
func TestPermissionMessage(t *testing.T) {
	for _, c := range []struct {
		err  auth.PermissionError
		want string
	}{
		{auth.PermissionError{Need: auth.PermAudit, Roles: []auth.Role{auth.RoleViewer}},
			"This needs the permission to read, export and verify the audit trail, which the roles auditor and admin have. You are signed in with the role viewer."},
		{auth.PermissionError{Need: auth.PermPaymentsAct, Roles: []auth.Role{auth.RoleViewer, auth.RoleAuditor}},
			"This needs the permission to act on payments (inquire, resolve, approve, settlement files), which the roles operator and admin have. You are signed in with the roles viewer and auditor."},
		{auth.PermissionError{Need: auth.PermView},
			"This needs the permission to view the console, which the roles viewer, operator, auditor and admin have. You are signed in with no console role."},
	} {
		if got := permissionMessage(&c.err); got != c.want+" Whoever assigns console roles at your identity provider can give you one of them." {
			t.Errorf("permissionMessage(%+v) = %q", c.err, got)
		}
	}
}
