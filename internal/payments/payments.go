// Package payments is the reference payments service of seed 002: an
// Idempotency-Key API whose financial effect happens once however often a
// request is retried, with a state machine (processing → completed | failed
// | unknown), lease recovery, balance reservations, an append-only ledger,
// outbox events, and reconciliation of unknown outcomes by evidence only.
//
// The flow of one POST /v1/payments:
//  1. ownership: INSERT … ON CONFLICT DO NOTHING RETURNING the idempotency
//     record as processing with a lease, in its own short committed
//     transaction (a loser reads the record and answers from it);
//  2. one transaction: payment row, reservation (a conditional UPDATE of
//     the account), payment.requested.v1 outbox event;
//  3. the provider call, outside any transaction and row lock, with the
//     operation id as the provider's idempotency key;
//  4. one transaction recording the outcome: completed (reservation
//     finalized, ledger debit), failed on a definite decline (reservation
//     released) or unknown (reservation kept) and the stored response.
//
// A machine never turns unknown into failed and never releases an unknown
// payment's reservation without a definite provider answer (an inquiry or a
// settlement file line); an operator may resolve with reason and evidence
// through Resolve, inside the console's own audited transaction.
package payments

import (
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"
)

// Status words of payment.status and idempotency_record.status.
type Status string

const (
	StatusProcessing Status = "processing"
	StatusCompleted  Status = "completed"
	StatusFailed     Status = "failed"
	StatusUnknown    Status = "unknown"
)

// Reservation status words.
const (
	ReservationActive    = "active"
	ReservationFinalized = "finalized"
	ReservationReleased  = "released"
)

// Outcome is a definite answer about a charge, as used by Resolve.
type Outcome string

const (
	OutcomeSucceeded Outcome = "succeeded"
	OutcomeFailed    Outcome = "failed"
)

// ParseOutcome reads "succeeded" or "failed".
func ParseOutcome(s string) (Outcome, error) {
	switch Outcome(s) {
	case OutcomeSucceeded, OutcomeFailed:
		return Outcome(s), nil
	}
	return "", ErrInvalidOutcome
}

// Sentinel errors.
var (
	ErrNotFound       = errors.New("payments: not found")
	ErrNotUnknown     = errors.New("payments: payment is not unknown (already resolved or still processing)")
	ErrInvalidOutcome = errors.New("payments: outcome must be succeeded or failed")
	ErrLeaseLost      = errors.New("payments: lease lost to another worker")
)

// Event types and the topic they go to.
const (
	EventRequested = "payment.requested.v1"
	EventCompleted = "payment.completed.v1"
	EventFailed    = "payment.failed.v1"
	EventUnknown   = "payment.unknown.v1"
	DefaultTopic   = "sluice.payments"
	AggregateType  = "payment"
)

// Payment is one payment row. Customer holds encrypted envelopes only.
type Payment struct {
	OperationID     uuid.UUID
	MerchantID      string
	InvoiceID       string
	PaymentType     string
	Attempt         int // 1 for an invoice's first payment; a new one only after every earlier attempt failed
	AccountID       int64
	Amount          decimal.Decimal
	Currency        string
	Customer        map[string]string // field → pii envelope
	Status          Status
	ProviderRef     string
	FailureCode     string
	UnknownSince    *time.Time
	NextInquiryAt   *time.Time
	InquiryAttempts int
	// LastInquiryAt and LastInquiryAnswer are the provider's latest answer
	// to an inquiry (an outcome word, or AnswerNone when it did not answer).
	LastInquiryAt     *time.Time
	LastInquiryAnswer string
	ResolvedAt        *time.Time
	ResolvedBy        string
	CreatedAt         time.Time
	UpdatedAt         time.Time
}

// Record is an idempotency record.
type Record struct {
	MerchantID     string
	Key            string
	RequestHash    string
	Status         Status
	OperationID    uuid.UUID
	ResponseStatus int
	ResponseBody   []byte
	LockedUntil    *time.Time
	CreatedAt      time.Time
	ExpiresAt      time.Time
}

// Reservation is one balance_reservation row.
type Reservation struct {
	OperationID uuid.UUID
	AccountID   int64
	Amount      decimal.Decimal
	Status      string
}

// LedgerEntry is one ledger_entry row.
type LedgerEntry struct {
	EntryID     int64
	OperationID uuid.UUID
	AccountID   int64
	EntryType   string
	Amount      decimal.Decimal
	Currency    string
	Memo        string
	CreatedAt   time.Time
}
