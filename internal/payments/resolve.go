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
	"github.com/sluice-dev/sluice/internal/outbox"
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

// settleOneSQL is the owner's settlement (settleTx with its lease and its
// provider call) as one statement sent on its own: one round trip and one
// commit instead of seven statements. Each write happens only when the one
// before returned its row: the key's lease still this worker's (lease) →
// the provider call's record (call) and the payment's move from @from (p; a
// payment another worker moved stops here, the call still recorded) → the
// books (booksSQL), the event (ev, its time completed here) and the key's
// stored answer (rec). sluice_assert refuses to commit a moved payment
// without the rest.
var settleOneSQL = `
	WITH lease AS (
		SELECT 1 FROM idempotency_record WHERE operation_id = @op AND status = 'processing' AND locked_until = @fence FOR UPDATE),
	call AS (` + insertCallSQL + ` WHERE EXISTS (SELECT 1 FROM lease) RETURNING 1),
	p AS (
		UPDATE payment SET ` + transitionSet + `
		FROM (SELECT ` + dbNow + ` AS now) t
		WHERE operation_id = @op AND status = @from AND EXISTS (SELECT 1 FROM lease)
		RETURNING ` + paymentCols + `),
	` + booksSQL("EXISTS (SELECT 1 FROM p)", "(SELECT updated_at FROM p)") + `,
	` + outbox.WriteSQL("ev", "p", `jsonb_set(@ev_payload::jsonb, '{occurred_at}', `+jsonTime("p.updated_at")+`)`) + `,
	rec AS (
		UPDATE idempotency_record SET status = @to, response_status = @response_status, response_body = @response_body::jsonb,
			locked_until = NULL, updated_at = p.updated_at
		FROM p WHERE idempotency_record.operation_id = @op
		RETURNING response_body)
	SELECT EXISTS (SELECT 1 FROM lease), EXISTS (SELECT 1 FROM p), (SELECT response_body FROM rec),
		sluice_assert(NOT EXISTS (SELECT 1 FROM p) OR ((@books_to = '' OR ` + booksMoved + `) AND EXISTS (SELECT 1 FROM ev) AND EXISTS (SELECT 1 FROM rec)),
			'settle: a payment moved without its books, event or stored answer')`

// settleOneStmt is settleOneSQL rewritten to $n placeholders once.
var settleOneStmt = db.NewNamed(settleOneSQL)

// settleOwned records the outcome of the charge this worker made for p,
// which it reserved (own): in one statement (settleOneSQL), or in settle's
// transaction when that statement failed for another reason than a lost
// lease or a payment moved by another worker.
func (s *Service) settleOwned(ctx context.Context, p Payment, to Status, d details, lease time.Time, call callRecord) (Record, error) {
	rec, err := s.settleOne(ctx, p, to, d, lease, call)
	switch {
	case err == nil:
		return rec, nil
	case errors.Is(err, ErrLeaseLost):
		s.recordCall(ctx, p.OperationID, call) // the statement wrote nothing
		return Record{}, err
	case errors.Is(err, errStateChanged):
		return Record{}, err // the call was recorded
	}
	s.log.Warn("payments: settle in one statement; trying in a transaction", "operation_id", p.OperationID, "err", err)
	// The statement may have committed, the call's record with it, with
	// its answer lost.
	call.maybeRecorded = true
	return s.settle(ctx, p.OperationID, StatusProcessing, to, d, &lease, &call)
}

func (s *Service) settleOne(ctx context.Context, p Payment, to Status, d details, lease time.Time, call callRecord) (Record, error) {
	d = s.inquiries(to, d)
	// What the statement makes of p: transitionSet's columns, as the event
	// and the key's stored answer carry them.
	next := p
	next.Status, next.FailureCode, next.ResolvedBy = to, d.failureCode, d.resolvedBy
	if d.providerRef != "" {
		next.ProviderRef = d.providerRef
	}
	var eventType, books string
	switch to {
	case StatusCompleted:
		eventType, books = EventCompleted, ReservationFinalized
	case StatusFailed:
		eventType, books = EventFailed, ReservationReleased
	case StatusUnknown:
		eventType = EventUnknown // the reservation stays active: money may have moved
	default:
		return Record{}, fmt.Errorf("payments: no transition to %q", to)
	}
	w, err := eventWrite(ctx, nil, s.cfg.Topic, eventType, next, time.Time{}, nil)
	if err != nil {
		return Record{}, err
	}
	status, body := storedResponse(next)
	args := s.callArgs(p.OperationID, call)
	args["fence"], args["from"] = lease, string(StatusProcessing)
	args["response_status"], args["response_body"] = status, string(body)
	d.bind(args, to)
	bindBooks(args, p, books)
	w.Bind(args, "ev")
	var held, moved bool
	var stored []byte // the answer as the key keeps it (jsonb's text), for replays to match
	err = queryOne(ctx, s.pool, settleOneStmt, args, func(row pgx.Rows) error { return row.Scan(&held, &moved, &stored, new(bool)) })
	switch {
	case err != nil:
		return Record{}, fmt.Errorf("payments: settle %s as %s: %w", p.OperationID, to, err)
	case !held:
		return Record{}, ErrLeaseLost
	case !moved:
		return Record{}, errStateChanged
	}
	s.poke()
	s.m.payments.WithLabelValues(string(to)).Inc()
	return Record{MerchantID: p.MerchantID, Status: to, OperationID: p.OperationID, ResponseStatus: status, ResponseBody: stored}, nil
}

// inquiries sets when a settled payment's first inquiry is due: an unknown
// one's, and the re-checks of one failed as provider_unavailable.
func (s *Service) inquiries(to Status, d details) details {
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
	return d
}

func (s *Service) settleTx(ctx context.Context, op uuid.UUID, from, to Status, d details, fence *time.Time, call *callRecord) (Record, error) {
	d = s.inquiries(to, d)
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
				call AS (`+insertCallOnce(*call)+` `+andOrWhere(call.maybeRecorded)+` EXISTS (SELECT 1 FROM lease) RETURNING 1)
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
			if _, err := tx.Exec(ctx, insertCallOnce(*call), s.callArgs(op, *call)); err != nil {
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

// transitionSet is the SET list of a payment's UPDATE from one state to
// @to (details.bind), stamped t.now: transition's, and settleOne's.
const transitionSet = `
			status = @to,
			provider_ref = coalesce(nullif(@ref, ''), provider_ref),
			failure_code = nullif(@code, ''),
			unknown_since = CASE WHEN @to = 'unknown' THEN t.now ELSE unknown_since END,
			next_inquiry_at = CASE WHEN @after::bigint > 0 THEN t.now + @after::bigint * interval '1 microsecond' END,
			resolved_at = CASE WHEN @by <> '' THEN t.now ELSE resolved_at END,
			resolved_by = nullif(@by, ''),
			updated_at = t.now`

// bind sets transitionSet's arguments for a move to to.
func (d details) bind(args pgx.NamedArgs, to Status) {
	args["to"] = string(to)
	args["ref"] = d.providerRef
	args["code"] = d.failureCode
	args["after"] = d.inquireAfter.Microseconds()
	args["by"] = d.resolvedBy
}

// transition is the one place a payment changes state: UPDATE … WHERE
// status = from makes it happen once, and the reservation, ledger, event
// and stored response change in the same transaction, all stamped with the
// payment's updated_at (nowArg, or the database clock when it is nil).
func transition(ctx context.Context, tx pgx.Tx, op uuid.UUID, from, to Status, d details, nowArg *time.Time, topic string) (Payment, Record, error) {
	// Due inquiries: of an unknown payment, or the bounded re-checks of one
	// failed as provider_unavailable (settle sets them); none otherwise.
	args := pgx.NamedArgs{"op": op, "from": string(from), "now": nowArg}
	d.bind(args, to)
	p, err := scanPayment(tx.QueryRow(ctx, `
		UPDATE payment SET `+transitionSet+`
		FROM (SELECT `+dbNow+` AS now) t
		WHERE operation_id = @op AND status = @from
		RETURNING `+paymentCols, args))
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
	args := pgx.NamedArgs{"now": now}
	bindBooks(args, p, to)
	var ok bool
	err := tx.QueryRow(ctx, `WITH `+booksSQL("true", "@now::timestamptz")+` SELECT `+booksMoved, args).Scan(&ok)
	if err != nil {
		return fmt.Errorf("payments: move the books of %s to %s: %w", p.OperationID, to, err)
	}
	if !ok {
		return fmt.Errorf("payments: operation %s has no active reservation (or its account is gone)", p.OperationID)
	}
	return nil
}

// booksSQL is moveBooks' statement as WITH items (books_r, books_a,
// books_l), for it and for settleOne: when the condition when holds and
// @books_to is not empty, the payment's active reservation becomes
// @books_to, its account is debited (finalized) or freed (released), and a
// finalized one gets its ledger debit, stamped at; the account and the
// ledger change only when the reservation was active. booksMoved is true
// when all of that happened.
func booksSQL(when, at string) string {
	return `books_r AS (
			UPDATE balance_reservation SET status = @books_to, updated_at = ` + at + `
			WHERE operation_id = @books_op AND status = 'active' AND @books_to <> '' AND ` + when + `
			RETURNING 1),
		books_a AS (
			UPDATE account SET balance = balance - CASE WHEN @books_debit THEN @books_amount::numeric ELSE 0 END,
				reserved = reserved - @books_amount::numeric, updated_at = ` + at + `
			WHERE account_id = @books_account AND EXISTS (SELECT 1 FROM books_r)
			RETURNING 1),
		books_l AS (
			INSERT INTO ledger_entry (operation_id, account_id, entry_type, amount, currency, memo, created_at)
			SELECT @books_op, @books_account, 'debit', @books_amount::numeric, @books_currency, @books_memo, ` + at + `
			WHERE @books_debit AND EXISTS (SELECT 1 FROM books_r)
			RETURNING 1)`
}

const booksMoved = `(EXISTS (SELECT 1 FROM books_r) AND EXISTS (SELECT 1 FROM books_a) AND (EXISTS (SELECT 1 FROM books_l) = @books_debit))`

// bindBooks sets booksSQL's arguments: p's reservation moves to to
// (ReservationFinalized or ReservationReleased; "" moves nothing).
func bindBooks(args pgx.NamedArgs, p Payment, to string) {
	args["books_op"] = p.OperationID
	args["books_to"] = to
	args["books_debit"] = to == ReservationFinalized
	args["books_account"] = p.AccountID
	args["books_amount"] = p.Amount.StringFixed(2)
	args["books_currency"] = p.Currency
	args["books_memo"] = "payment " + p.InvoiceID
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
