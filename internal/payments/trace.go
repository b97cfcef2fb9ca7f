package payments

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
)

// Times are the moments of a payment's business rows that the rows the
// console reads elsewhere do not carry: when the API request's idempotency
// record was written and last changed, and when the reservation was made
// and last changed. A nil time is a row that does not exist.
type Times struct {
	RecordCreated      *time.Time
	RecordUpdated      *time.Time
	ReservationCreated *time.Time
	ReservationUpdated *time.Time
	ReservationStatus  string
	ReservationAmount  string
	ReservationExpires *time.Time
}

// TimesOf reads a payment's Times: two probes by operation id (the unique
// indexes on idempotency_record and balance_reservation). ErrNotFound when
// the payment does not exist.
func TimesOf(ctx context.Context, q db.RowQuerier, op uuid.UUID) (Times, error) {
	var t Times
	var amount *string
	var status *string
	err := q.QueryRow(ctx, `
		SELECT r.created_at, r.updated_at, b.created_at, b.updated_at, b.status, b.amount::text, b.expires_at
		  FROM payment p
		  LEFT JOIN idempotency_record r ON r.operation_id = p.operation_id
		  LEFT JOIN balance_reservation b ON b.operation_id = p.operation_id
		 WHERE p.operation_id = $1`, op).
		Scan(&t.RecordCreated, &t.RecordUpdated, &t.ReservationCreated, &t.ReservationUpdated, &status, &amount, &t.ReservationExpires)
	if errors.Is(err, pgx.ErrNoRows) {
		return Times{}, ErrNotFound
	}
	if err != nil {
		return Times{}, fmt.Errorf("payments: times of %s: %w", op, err)
	}
	if status != nil {
		t.ReservationStatus = *status
	}
	if amount != nil {
		t.ReservationAmount = *amount
	}
	return t, nil
}
