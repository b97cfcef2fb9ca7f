package views

import (
	"strings"

	"github.com/sluice-dev/sluice/internal/payments"
)

// StaffNames maps staff ids (iss|sub, as payments keep them) to the names
// a page knows them by: a payment's approvals and audit rows carry both.
type StaffNames map[string]string

// AddApprovals records the requesters and deciders of approvals.
func (n StaffNames) AddApprovals(as []payments.Approval) {
	for _, a := range as {
		n.add(a.RequestedBy, a.RequesterName)
		n.add(a.DecidedBy, a.DeciderName)
	}
}

func (n StaffNames) add(id, name string) {
	if id != "" && name != "" {
		n[id] = name
	}
}

// Add records the actor of an audit row.
func (n StaffNames) Add(iss, sub, name string) { n.add(iss+"|"+sub, name) }

func (n StaffNames) name(id string) string {
	if name, ok := n[id]; ok {
		return name
	}
	return id // unknown here: the id is what there is (never PII)
}

// ResolvedBy says in words who resolved a payment. resolved_by keeps ids
// only ("operator:<iss|sub>", "operator:<iss|sub> approved by <iss|sub>",
// "settlement:<source>"), so it can travel in events; pages show the
// names. settledBy names whoever applied the settlement file, when known.
func ResolvedBy(by string, names StaffNames, settledBy string) string {
	switch {
	case strings.HasPrefix(by, "operator:"):
		requester, approver, approved := strings.Cut(strings.TrimPrefix(by, "operator:"), " approved by ")
		out := "operator " + names.name(requester)
		if approved {
			out += ", approved by " + names.name(approver)
		}
		return out
	case strings.HasPrefix(by, "settlement:"):
		out := "settlement file " + strings.TrimPrefix(by, "settlement:")
		if settledBy != "" {
			out += ", applied by " + settledBy
		}
		return out
	}
	return by
}

// ResolvedByWhom is the kind of resolver, for a timeline's title.
func ResolvedByWhom(by string) string {
	switch {
	case strings.HasPrefix(by, "operator:"):
		return "an operator"
	case strings.HasPrefix(by, "settlement:"):
		return "a settlement file"
	}
	return by
}
