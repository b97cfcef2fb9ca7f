package payments

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/db"
)

// States of a four-eyes request (payment_approval.state).
const (
	ApprovalPending  = "pending"
	ApprovalApproved = "approved"
	ApprovalRejected = "rejected"
)

// Errors of the four-eyes requests.
var (
	ErrApprovalPending = errors.New("payments: a resolution of this payment is already waiting for approval")
	ErrSelfApproval    = errors.New("payments: a request cannot be decided by the operator who made it")
	ErrNotPending      = errors.New("payments: the request has been decided already")
)

// Approval is a four-eyes request to resolve an unknown payment: one
// operator asks, a different one approves (the resolve happens then) or
// rejects (the payment stays unknown).
type Approval struct {
	ID            int64
	OperationID   uuid.UUID
	Outcome       Outcome
	Reason        string
	Evidence      string
	ProviderRef   string // from a settlement file's line, set on the payment when approved
	RequestedBy   string // iss|sub
	RequesterName string
	RequestedAt   time.Time
	State         string
	DecidedBy     string // iss|sub
	DeciderName   string
	DecidedAt     *time.Time
	// Of the payment, read in the same statement (a join on its primary
	// key), so an approver sees what the request is about and that the
	// payment is still unknown without opening it, and a list of requests
	// costs one query.
	MerchantID    string
	InvoiceID     string
	Amount        decimal.Decimal
	Currency      string
	PaymentStatus Status
}

// ApprovalRequest is what RequestResolve records.
type ApprovalRequest struct {
	OperationID   uuid.UUID
	Outcome       Outcome
	Reason        string
	Evidence      string
	ProviderRef   string // a settlement file's line's reference, if any
	RequestedBy   string // iss|sub: no PII
	RequesterName string
}

const approvalCols = `a.id, a.operation_id, a.outcome, a.reason, a.evidence, a.provider_ref, a.requested_by, a.requester_name, a.requested_at,
	a.state, coalesce(a.decided_by, ''), coalesce(a.decider_name, ''), a.decided_at, p.merchant_id, p.invoice_id, p.amount::text, p.currency, p.status`

func scanApproval(row pgx.Row) (Approval, error) {
	var a Approval
	var outcome, amount, status string
	err := row.Scan(&a.ID, &a.OperationID, &outcome, &a.Reason, &a.Evidence, &a.ProviderRef, &a.RequestedBy, &a.RequesterName, &a.RequestedAt,
		&a.State, &a.DecidedBy, &a.DeciderName, &a.DecidedAt, &a.MerchantID, &a.InvoiceID, &amount, &a.Currency, &status)
	if err != nil {
		return Approval{}, notFound(err)
	}
	a.Outcome, a.PaymentStatus = Outcome(outcome), Status(status)
	if a.Amount, err = decimal.NewFromString(amount); err != nil {
		return Approval{}, fmt.Errorf("payments: approval %d amount %q: %w", a.ID, amount, err)
	}
	return a, nil
}

// RequestResolve records a pending request to resolve an unknown payment,
// in the caller's transaction (the console audits it in the same commit).
// It changes nothing else. ErrNotUnknown: the payment is not unknown;
// ErrApprovalPending: a request for it is waiting already.
func RequestResolve(ctx context.Context, tx pgx.Tx, r ApprovalRequest) (Approval, error) {
	if _, err := ParseOutcome(string(r.Outcome)); err != nil {
		return Approval{}, err
	}
	var status string
	// FOR SHARE: a resolution cannot commit between this check and the
	// request's commit.
	err := tx.QueryRow(ctx, `SELECT status FROM payment WHERE operation_id = $1 FOR SHARE`, r.OperationID).Scan(&status)
	if err != nil {
		return Approval{}, fmt.Errorf("payments: request a resolution of %s: %w", r.OperationID, notFound(err))
	}
	if Status(status) != StatusUnknown {
		return Approval{}, ErrNotUnknown
	}
	var id int64
	err = tx.QueryRow(ctx, `
		INSERT INTO payment_approval (operation_id, outcome, reason, evidence, provider_ref, requested_by, requester_name)
		VALUES (@op, @outcome, @reason, @evidence, @ref, @by, @name)
		ON CONFLICT (operation_id) WHERE state = 'pending' DO NOTHING
		RETURNING id`, pgx.NamedArgs{"op": r.OperationID, "outcome": string(r.Outcome), "reason": r.Reason,
		"evidence": r.Evidence, "ref": r.ProviderRef, "by": r.RequestedBy, "name": r.RequesterName}).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Approval{}, ErrApprovalPending
	}
	if err != nil {
		return Approval{}, fmt.Errorf("payments: request a resolution of %s: %w", r.OperationID, err)
	}
	return GetApproval(ctx, tx, id)
}

// GetApproval reads one request.
func GetApproval(ctx context.Context, q db.RowQuerier, id int64) (Approval, error) {
	return scanApproval(q.QueryRow(ctx, `SELECT `+approvalCols+` FROM payment_approval a JOIN payment p USING (operation_id) WHERE a.id = $1`, id))
}

// Decision is an approval or a rejection of a request.
type Decision struct {
	ID          int64
	Approve     bool
	DecidedBy   string // iss|sub
	DeciderName string
	Topic       string // outbox topic of the resolution (default sluice.payments)
}

// Decide approves or rejects a pending request in the caller's transaction:
// compare-and-set on the pending state, never by its requester
// (ErrSelfApproval). Approval resolves the payment in the same transaction
// (Resolve: ErrNotUnknown when it is not unknown any more, and then nothing
// is decided); rejection leaves the payment unknown. ErrNotPending: decided
// already; ErrNotFound: no such request. The returned Payment is the
// resolved one (approval only); the caller pokes the relays after commit.
func Decide(ctx context.Context, tx pgx.Tx, d Decision) (Approval, Payment, error) {
	a, err := scanApproval(tx.QueryRow(ctx, `SELECT `+approvalCols+` FROM payment_approval a JOIN payment p USING (operation_id)
		WHERE a.id = $1 FOR UPDATE OF a`, d.ID))
	if err != nil {
		return Approval{}, Payment{}, fmt.Errorf("payments: decide request %d: %w", d.ID, err)
	}
	if a.State != ApprovalPending {
		return a, Payment{}, ErrNotPending
	}
	if a.RequestedBy == d.DecidedBy {
		return a, Payment{}, ErrSelfApproval
	}
	state := ApprovalRejected
	if d.Approve {
		state = ApprovalApproved
	}
	if _, err := tx.Exec(ctx, `UPDATE payment_approval SET state = $2, decided_by = $3, decider_name = $4, decided_at = statement_timestamp()
		WHERE id = $1 AND state = 'pending'`, d.ID, state, d.DecidedBy, d.DeciderName); err != nil {
		return a, Payment{}, fmt.Errorf("payments: decide request %d: %w", d.ID, err)
	}
	var p Payment
	if d.Approve {
		p, err = Resolve(ctx, tx, a.OperationID, a.Outcome, ResolveOptions{ProviderRef: a.ProviderRef,
			ResolvedBy: "operator:" + a.RequestedBy + " approved by " + d.DecidedBy, Topic: d.Topic})
		if err != nil {
			return a, Payment{}, err
		}
	}
	out, err := GetApproval(ctx, tx, d.ID)
	return out, p, err
}

// PendingApprovals lists up to limit pending requests, oldest first.
func PendingApprovals(ctx context.Context, q db.Querier, limit int) ([]Approval, error) {
	if limit <= 0 || limit > 500 {
		limit = 100
	}
	return collectApprovals(q.Query(ctx, pendingApprovalsSQL, limit))
}

// pendingApprovalsSQL walks the pending requests' partial index in the
// list's order and reads each one's payment by its primary key: the
// approvals page is one statement however many requests wait.
const pendingApprovalsSQL = `SELECT ` + approvalCols + ` FROM payment_approval a JOIN payment p USING (operation_id)
	WHERE a.state = 'pending' ORDER BY a.requested_at, a.id LIMIT $1`

// ApprovalsOf lists a payment's requests, newest first.
func ApprovalsOf(ctx context.Context, q db.Querier, op uuid.UUID) ([]Approval, error) {
	return collectApprovals(q.Query(ctx, `SELECT `+approvalCols+` FROM payment_approval a JOIN payment p USING (operation_id)
		WHERE a.operation_id = $1 ORDER BY a.id DESC LIMIT 100`, op))
}

func collectApprovals(rows pgx.Rows, err error) ([]Approval, error) {
	if err != nil {
		return nil, fmt.Errorf("payments: approvals: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Approval, error) { return scanApproval(r) })
	if err != nil {
		return nil, fmt.Errorf("payments: approvals: %w", err)
	}
	return out, nil
}

// PendingState says which four-eyes requests wait: how many, and the
// newest one's id. Any request made or decided changes it, so the console's
// feed can tell the approvals pages to reload their list only then.
type PendingState struct {
	Pending int64 `json:"pending"`
	Newest  int64 `json:"newest"`
}

// PendingRead reads PendingState through the pending requests' partial
// index: O(pending), a db.Read part of the console's snapshot.
type PendingRead struct{ State PendingState }

// Expr implements db.Read.
func (r *PendingRead) Expr(*db.Args) string {
	return `SELECT json_build_object('pending', count(*), 'newest', coalesce(max(id), 0))
	  FROM payment_approval WHERE state = 'pending'`
}

// Scan implements db.Read.
func (r *PendingRead) Scan(src []byte) error {
	if err := db.ScanJSON(src, &r.State); err != nil {
		return fmt.Errorf("payments: pending approvals: %w", err)
	}
	return nil
}
