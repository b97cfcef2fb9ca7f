// Package provider talks to the payment provider: an interface with Charge
// and Inquire, an HTTP client for it, and a simulated provider (an HTTP
// server of its own, so timeouts are real network timeouts) that keeps its
// own record of real charges.
//
// The wire protocol (the simulator's, and what Client speaks):
//
//	POST /v1/charges            {"operation_id","amount","currency"}, header Idempotency-Key: <operation_id>
//	  200 {"operation_id","status":"succeeded"|"declined","provider_ref","decline_code"}
//	  503 {"error":"unavailable"}   the request was NOT processed (nothing charged)
//	GET  /v1/charges/{operation_id}
//	  200 {"operation_id","status":"succeeded"|"declined"|"not_found"|"unknown",...}
//
// A charge is idempotent by operation id: a second charge with the same id
// returns the first one's result and moves no money.
package provider

import (
	"context"
	"errors"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"
)

// Outcome is what the provider says about a charge.
type Outcome string

const (
	Succeeded Outcome = "succeeded" // money moved (definite)
	Declined  Outcome = "declined"  // refused, nothing moved (definite)
	NotFound  Outcome = "not_found" // the provider has no charge with this id (inquiry only)
	Unknown   Outcome = "unknown"   // the provider cannot say (inquiry only)
)

// Definite reports whether o settles a charge either way.
func (o Outcome) Definite() bool { return o == Succeeded || o == Declined }

// Result is a provider answer.
type Result struct {
	OperationID uuid.UUID
	Outcome     Outcome
	ProviderRef string
	DeclineCode string
}

// ChargeRequest asks for one charge; OperationID is the provider's
// idempotency key.
type ChargeRequest struct {
	OperationID uuid.UUID
	Amount      decimal.Decimal
	Currency    string
}

// Errors of Charge and Inquire.
var (
	// ErrNotProcessed: the provider definitely did not process the request
	// (connection refused, or its explicit 503 "unavailable"). Nothing moved.
	ErrNotProcessed = errors.New("provider: request not processed")
	// ErrOutcomeUnknown: the request may or may not have been processed
	// (timeout, connection cut, unexpected answer). Money may have moved.
	ErrOutcomeUnknown = errors.New("provider: outcome unknown")
)

// Provider is the payment provider as the payments service needs it.
type Provider interface {
	// Charge moves money once per operation id. A nil error comes with a
	// definite outcome (Succeeded or Declined); otherwise the error wraps
	// ErrNotProcessed or ErrOutcomeUnknown.
	Charge(ctx context.Context, req ChargeRequest) (Result, error)
	// Inquire asks what happened to the charge with this operation id. An
	// error means no answer (treat as Unknown).
	Inquire(ctx context.Context, operationID uuid.UUID) (Result, error)
}
