package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
)

// errStateChanged: the payment was not in the state a transition expected
// (another worker moved it first).
var errStateChanged = errors.New("payments: payment state changed")

// details of a transition.
type details struct {
	providerRef  string
	failureCode  string
	resolvedBy   string        // set when an inquiry, a settlement file or an operator resolves
	inquireAfter time.Duration // > 0: the next inquiry is due this long after the transition
}

// settle records a charge's outcome in one transaction. With a fence, the
// caller must still hold the key's lease (locked_until = *fence).
//
// call, when not nil, is the provider call whose answer this is: it is
// written in the same transaction when the lease still holds, and on its own
// otherwise (recording never changes a payment's course).
func (s *Service) settle(ctx context.Context, op uuid.UUID, from, to Status, d details, fence *time.Time, call *callRecord) (Record, error) {
	rec, err := s.settleTx(ctx, op, from, to, d, fence, call)
	if err == nil || call == nil {
		return rec, err
	}
	// The transaction did not keep the call: write it on its own; and as
	// the failure may have been the call's insert, settle again without it.
	s.recordCall(ctx, op, *call)
	if errors.Is(err, ErrLeaseLost) || errors.Is(err, errStateChanged) {
		return rec, err
	}
	s.log.Warn("payments: settle with the provider call's record", "operation_id", op, "err", err)
	return s.settleTx(ctx, op, from, to, d, fence, nil)
}

func (s *Service) settleTx(ctx context.Context, op uuid.UUID, from, to Status, d details, fence *time.Time, call *callRecord) (Record, error) {
	if to == StatusUnknown {
		d.inquireAfter = s.cfg.InquiryBackoff
	}
	if to == StatusFailed && d.failureCode == CodeProviderUnavailable {
		// "Not processed" is the provider's word, or our reading of the
		// network; if either was wrong the money moved while we released it.
		// The reconcile worker checks a few times by inquiry and files a
		// discrepancy if the provider says it charged (never flips it).
		d.inquireAfter = s.cfg.InquiryBackoff
	}
	rec, err := db.WithTxV(ctx, s.pool, func(tx pgx.Tx) (Record, error) {
		switch {
		case fence != nil && call != nil:
			// The lease check and the call's record in one statement: the
			// call is written only while this worker holds the key.
			args := s.callArgs(op, *call)
			args["fence"] = *fence
			var held bool
			err := tx.QueryRow(ctx, `
				WITH lease AS (
					SELECT 1 FROM idempotency_record WHERE operation_id = @op AND status = 'processing' AND locked_until = @fence FOR UPDATE),
				call AS (`+insertCallSQL+` WHERE EXISTS (SELECT 1 FROM lease) RETURNING 1)
				SELECT EXISTS (SELECT 1 FROM lease), EXISTS (SELECT 1 FROM call)`, args).Scan(&held, new(bool))
			if err != nil {
				return Record{}, fmt.Errorf("payments: check the lease of %s: %w", op, err)
			}
			if !held {
				return Record{}, ErrLeaseLost
			}
		case fence != nil:
			var one int
			err := tx.QueryRow(ctx, `SELECT 1 FROM idempotency_record WHERE operation_id = $1 AND status = 'processing' AND locked_until = $2 FOR UPDATE`, op, *fence).Scan(&one)
			if errors.Is(err, pgx.ErrNoRows) {
				return Record{}, ErrLeaseLost
			}
			if err != nil {
				return Record{}, fmt.Errorf("payments: check the lease of %s: %w", op, err)
			}
		case call != nil:
			if _, err := tx.Exec(ctx, insertCallSQL, s.callArgs(op, *call)); err != nil {
				return Record{}, fmt.Errorf("payments: record the provider call of %s: %w", op, err)
			}
		}
		_, rec, err := transition(ctx, tx, op, from, to, d, s.nowArg(), s.cfg.Topic)
		return rec, err
	})
	if errors.Is(err, ErrLeaseLost) || errors.Is(err, errStateChanged) {
		return Record{}, err
	}
	if err != nil {
		return Record{}, fmt.Errorf("payments: settle %s as %s: %w", op, to, err)
	}
	s.poke()
	s.m.payments.WithLabelValues(string(to)).Inc()
	return rec, nil
}

// ResolveOptions describe a resolution of an unknown payment.
type ResolveOptions struct {
	ProviderRef string    // the provider's reference, when known
	FailureCode string    // for failed (default payment_failed)
	ResolvedBy  string    // "inquiry", "settlement:<file>", or the operator (iss|sub): no PII
	Topic       string    // outbox topic (default sluice.payments)
	Now         time.Time // zero: the database clock
}

// Resolve moves an unknown payment to completed (reservation finalized,
// ledger debit, payment.completed.v1) or failed (reservation released,
// payment.failed.v1), once: it runs in the caller's transaction tx so the
// console can write its audit event in the same commit, and returns
// ErrNotUnknown when the payment is not unknown any more (a concurrent
// resolution won) and ErrNotFound when there is no such payment. The key's
// stored response becomes the final answer. It writes an outbox event: the
// caller pokes the relays after its commit.
func Resolve(ctx context.Context, tx pgx.Tx, operationID uuid.UUID, outcome Outcome, opts ResolveOptions) (Payment, error) {
	to := StatusCompleted
	switch outcome {
	case OutcomeSucceeded:
	case OutcomeFailed:
		to = StatusFailed
		if opts.FailureCode == "" {
			opts.FailureCode = CodePaymentFailed
		}
	default:
		return Payment{}, ErrInvalidOutcome
	}
	if opts.Topic == "" {
		opts.Topic = DefaultTopic
	}
	if opts.ResolvedBy == "" {
		opts.ResolvedBy = "unspecified"
	}
	var now *time.Time
	if !opts.Now.IsZero() {
		t := opts.Now.UTC()
		now = &t
	}
	p, _, err := transition(ctx, tx, operationID, StatusUnknown, to, details{providerRef: opts.ProviderRef, failureCode: opts.FailureCode, resolvedBy: opts.ResolvedBy}, now, opts.Topic)
	return p, err
}

// transition is the one place a payment changes state: UPDATE … WHERE
// status = from makes it happen once, and the reservation, ledger, event
// and stored response change in the same transaction, all stamped with the
// payment's updated_at (nowArg, or the database clock when it is nil).
func transition(ctx context.Context, tx pgx.Tx, op uuid.UUID, from, to Status, d details, nowArg *time.Time, topic string) (Payment, Record, error) {
	// Due inquiries: of an unknown payment, or the bounded re-checks of one
	// failed as provider_unavailable (settle sets them); none otherwise.
	p, err := scanPayment(tx.QueryRow(ctx, `
		UPDATE payment SET
			status = @to,
			provider_ref = coalesce(nullif(@ref, ''), provider_ref),
			failure_code = nullif(@code, ''),
			unknown_since = CASE WHEN @to = 'unknown' THEN t.now ELSE unknown_since END,
			next_inquiry_at = CASE WHEN @after::bigint > 0 THEN t.now + @after::bigint * interval '1 microsecond' END,
			resolved_at = CASE WHEN @by <> '' THEN t.now ELSE resolved_at END,
			resolved_by = nullif(@by, ''),
			updated_at = t.now
		FROM (SELECT `+dbNow+` AS now) t
		WHERE operation_id = @op AND status = @from
		RETURNING `+paymentCols, pgx.NamedArgs{
		"op": op, "from": string(from), "to": string(to), "ref": d.providerRef, "code": d.failureCode,
		"after": d.inquireAfter.Microseconds(), "by": d.resolvedBy, "now": nowArg,
	}))
	if errors.Is(err, ErrNotFound) {
		if _, gerr := Get(ctx, tx, op); gerr != nil {
			return Payment{}, Record{}, fmt.Errorf("payments: move %s to %s: %w", op, to, gerr)
		}
		if from == StatusUnknown {
			return Payment{}, Record{}, ErrNotUnknown
		}
		return Payment{}, Record{}, errStateChanged
	}
	if err != nil {
		return Payment{}, Record{}, fmt.Errorf("payments: move %s from %s to %s: %w", op, from, to, err)
	}
	now := p.UpdatedAt
	var eventType string
	switch to {
	case StatusCompleted:
		if err := moveBooks(ctx, tx, p, ReservationFinalized, now); err != nil {
			return Payment{}, Record{}, err
		}
		eventType = EventCompleted
	case StatusFailed:
		if err := moveBooks(ctx, tx, p, ReservationReleased, now); err != nil {
			return Payment{}, Record{}, err
		}
		eventType = EventFailed
	case StatusUnknown:
		// The reservation stays active: money may have moved.
		eventType = EventUnknown
	default:
		return Payment{}, Record{}, fmt.Errorf("payments: no transition to %q", to)
	}
	if err := insertEvent(ctx, tx, nil, topic, eventType, p, now, nil); err != nil {
		return Payment{}, Record{}, err
	}
	status, body := storedResponse(p)
	rec, err := scanRecord(tx.QueryRow(ctx, `
		UPDATE idempotency_record SET status = $2, response_status = $3, response_body = $4::jsonb, locked_until = NULL, updated_at = $5
		WHERE operation_id = $1
		RETURNING `+recordCols, op, string(to), status, string(body), now))
	if err != nil && !errors.Is(err, ErrNotFound) { // a pruned key has nothing to update
		return Payment{}, Record{}, fmt.Errorf("payments: store the answer of %s: %w", op, err)
	}
	return p, rec, nil
}

// moveBooks moves the payment's active reservation to finalized (the
// account is debited and the ledger gets its debit entry) or released (the
// reserved amount is available again), in one statement: the account and
// the ledger change only when the reservation was active.
func moveBooks(ctx context.Context, tx pgx.Tx, p Payment, to string, now time.Time) error {
	debit := to == ReservationFinalized
	var moved int
	err := tx.QueryRow(ctx, `
		WITH r AS (
			UPDATE balance_reservation SET status = $2, updated_at = $3
			WHERE operation_id = $1 AND status = 'active'
			RETURNING 1),
		a AS (
			UPDATE account SET balance = balance - CASE WHEN $6 THEN $5::numeric ELSE 0 END, reserved = reserved - $5::numeric, updated_at = $3
			WHERE account_id = $4 AND EXISTS (SELECT 1 FROM r)
			RETURNING 1),
		l AS (
			INSERT INTO ledger_entry (operation_id, account_id, entry_type, amount, currency, memo, created_at)
			SELECT $1, $4, 'debit', $5::numeric, $7, $8, $3 WHERE $6 AND EXISTS (SELECT 1 FROM r)
			RETURNING 1)
		SELECT (SELECT count(*) FROM r) + (SELECT count(*) FROM a) + (SELECT count(*) FROM l)`,
		p.OperationID, to, now, p.AccountID, p.Amount.StringFixed(2), debit, p.Currency, "payment "+p.InvoiceID).Scan(&moved)
	if err != nil {
		return fmt.Errorf("payments: move the books of %s to %s: %w", p.OperationID, to, err)
	}
	want := 2
	if debit {
		want = 3
	}
	if moved != want {
		return fmt.Errorf("payments: operation %s has no active reservation (or its account is gone)", p.OperationID)
	}
	return nil
}

// PaymentBody is the JSON a client sees for a payment.
type PaymentBody struct {
	OperationID string            `json:"operation_id"`
	InvoiceID   string            `json:"invoice_id"`
	Attempt     int               `json:"attempt"` // 1, or more after earlier attempts of the invoice failed
	AccountID   int64             `json:"account_id"`
	Amount      string            `json:"amount"`
	Currency    string            `json:"currency"`
	Status      Status            `json:"status"`
	ProviderRef string            `json:"provider_ref,omitempty"`
	Code        string            `json:"code,omitempty"`
	Message     string            `json:"message,omitempty"`
	Customer    map[string]string `json:"customer,omitempty"` // masked, GET only
}

// storedResponse is the answer a key keeps for a payment in a final or
// unknown state.
func storedResponse(p Payment) (int, []byte) {
	b := bodyOf(p)
	status := 201
	switch p.Status {
	case StatusUnknown:
		status = 202
	case StatusFailed:
		status = 402
		if p.FailureCode == CodeProviderUnavailable {
			status = 502
		}
	case StatusProcessing:
		status = 202
	}
	out, _ := json.Marshal(b)
	return status, out
}

// bodyOf is the client's view of a payment, without the customer.
func bodyOf(p Payment) PaymentBody {
	b := PaymentBody{OperationID: p.OperationID.String(), InvoiceID: p.InvoiceID, Attempt: p.Attempt, AccountID: p.AccountID, Amount: p.Amount.StringFixed(2),
		Currency: p.Currency, Status: p.Status, ProviderRef: p.ProviderRef}
	switch p.Status {
	case StatusUnknown:
		b.Message = "the provider has not confirmed the outcome yet; it is being checked. Do not pay again: retry with the same Idempotency-Key for the final answer"
	case StatusFailed:
		b.Code = p.FailureCode
		if b.Code == "" {
			b.Code = CodePaymentFailed
		}
		switch b.Code {
		case CodeDeclined:
			b.Message = "the provider declined the payment"
		case CodeProviderUnavailable:
			b.Message = "the provider was unavailable; nothing was charged"
		default:
			b.Message = "the payment failed; nothing was charged"
		}
	}
	return b
}
