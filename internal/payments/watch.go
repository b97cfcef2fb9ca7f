package payments

import (
	"fmt"
	"strings"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/db"
)

// PaymentState is what a payment's page shows that another operator, the
// reconcile worker's inquiry, recovery or a settlement file changes after
// the page was read: its status, how it was resolved, and its newest
// four-eyes request. The console's feed reads it for the payments open
// pages watch (PaymentStatesRead, once per tick for all of them), and each
// page's socket compares it with the state its page showed. It carries no
// customer data, no amount and no staff id: a socket may push the
// difference as it is.
type PaymentState struct {
	OperationID uuid.UUID `json:"operation_id"`
	Status      Status    `json:"status"`
	Resolver    string    `json:"resolver"` // ResolverOf(resolved_by)
	// Approval is the id of the newest four-eyes request (0: none), and
	// ApprovalState its state (pending, approved, rejected).
	Approval      int64  `json:"approval"`
	ApprovalState string `json:"approval_state"`
}

// Who resolved a payment, in kinds (ResolverOf): resolved_by keeps staff
// ids, which the watched state leaves out.
const (
	ResolverOperator   = "operator"   // an operator's resolution
	ResolverApproved   = "approved"   // an operator's, approved by a second (four eyes)
	ResolverSettlement = "settlement" // a settlement file's line
	ResolverInquiry    = "inquiry"    // the provider's answer to an inquiry
	ResolverOther      = "other"      // a caller of Resolve that named no one
)

// ResolverOf is the kind of resolver a payment's resolved_by names ("": not
// resolved).
func ResolverOf(resolvedBy string) string {
	switch {
	case resolvedBy == "":
		return ""
	case strings.HasPrefix(resolvedBy, "operator:") && strings.Contains(resolvedBy, " approved by "):
		return ResolverApproved
	case strings.HasPrefix(resolvedBy, "operator:"):
		return ResolverOperator
	case strings.HasPrefix(resolvedBy, "settlement:"):
		return ResolverSettlement
	case resolvedBy == "inquiry":
		return ResolverInquiry
	}
	return ResolverOther
}

// StateOf is the watched state of a payment as its page read it, with its
// four-eyes requests (newest first, as ApprovalsOf lists them).
func StateOf(p Payment, approvals []Approval) PaymentState {
	s := PaymentState{OperationID: p.OperationID, Status: p.Status, Resolver: ResolverOf(p.ResolvedBy)}
	if len(approvals) > 0 {
		s.Approval, s.ApprovalState = approvals[0].ID, approvals[0].State
	}
	return s
}

// PaymentStatesRead reads the states of the payments IDs names, by primary
// key (the newest request through payment_approval_op_idx), as one part of
// a composed statement (db.Read): the feed's one read of every watched
// payment per tick. An id with no row is absent from States. The caller
// bounds IDs (live.MaxWatched).
type PaymentStatesRead struct {
	IDs    []uuid.UUID
	States []PaymentState
}

// Expr implements db.Read.
func (r *PaymentStatesRead) Expr(args *db.Args) string {
	return `SELECT coalesce(json_agg(json_build_object('operation_id', p.operation_id, 'status', p.status,
	                                 'resolved_by', coalesce(p.resolved_by, ''),
	                                 'approval', coalesce(a.id, 0), 'approval_state', coalesce(a.state, ''))), '[]')
	  FROM payment p
	  LEFT JOIN LATERAL (SELECT id, state FROM payment_approval
	                      WHERE operation_id = p.operation_id ORDER BY id DESC LIMIT 1) a ON true
	 WHERE p.operation_id = ANY(` + args.Add(r.IDs) + `::uuid[])`
}

// Scan implements db.Read.
func (r *PaymentStatesRead) Scan(src []byte) error {
	var rows []struct {
		PaymentState
		ResolvedBy string `json:"resolved_by"`
	}
	r.States = nil
	if err := db.ScanJSON(src, &rows); err != nil {
		return fmt.Errorf("payments: watched payments: %w", err)
	}
	r.States = make([]PaymentState, len(rows))
	for i, row := range rows {
		// Only the kind is kept: the staff ids stay in the database.
		row.PaymentState.Resolver = ResolverOf(row.ResolvedBy)
		r.States[i] = row.PaymentState
	}
	return nil
}
