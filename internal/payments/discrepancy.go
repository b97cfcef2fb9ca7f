package payments

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/payments/provider"
)

// Sources of a discrepancy's evidence.
const (
	DiscrepancySettlement = "settlement" // a line of a provider settlement file
	DiscrepancyInquiry    = "inquiry"    // the provider's answer to an inquiry
)

// Discrepancy is a final payment that the provider's evidence contradicts:
// failed here while the provider says it charged (money moved without our
// books knowing), or completed here while the provider says it did not. A
// machine never corrects one: it is recorded, counted
// (sluice_payments_discrepancies) and left open for an operator, whose
// correction closes it (ResolvedAt, ResolvedBy, Resolution).
type Discrepancy struct {
	ID              int64
	OperationID     uuid.UUID
	RecordedStatus  Status  // our status when the evidence arrived
	ProviderOutcome Outcome // what the provider says
	Source          string  // DiscrepancySettlement or DiscrepancyInquiry
	Evidence        string  // e.g. "settlement eod.csv sha256:… line 7", "inquiry"
	ProviderRef     string
	DetectedAt      time.Time
	ResolvedAt      *time.Time
	ResolvedBy      string
	Resolution      string
}

// contradicts reports whether a definite provider outcome contradicts a
// payment's final status.
func contradicts(status Status, outcome Outcome) bool {
	return (status == StatusFailed && outcome == OutcomeSucceeded) || (status == StatusCompleted && outcome == OutcomeFailed)
}

// outcomeOfProvider maps a definite provider answer to an Outcome.
func outcomeOfProvider(o provider.Outcome) Outcome {
	if o == provider.Succeeded {
		return OutcomeSucceeded
	}
	return OutcomeFailed
}

// recordDiscrepancy records d unless the payment has an open discrepancy
// already, and only while the payment still has d.RecordedStatus (checked in
// the same statement, so evidence about a status that just changed is not
// filed against the new one). It reports whether it created a row. It
// changes nothing else: not the payment, its reservation nor the ledger.
// It is detected at now (nil: the database clock); d.DetectedAt is ignored.
func recordDiscrepancy(ctx context.Context, q db.RowQuerier, d Discrepancy, now *time.Time) (bool, error) {
	var id int64
	err := q.QueryRow(ctx, `
		INSERT INTO payment_discrepancy (operation_id, recorded_status, provider_outcome, source, evidence, provider_ref, detected_at)
		SELECT p.operation_id, p.status, @outcome, @source, @evidence, nullif(@ref, ''), coalesce(@now::timestamptz, statement_timestamp())
		FROM payment p WHERE p.operation_id = @op AND p.status = @status
		ON CONFLICT (operation_id) WHERE resolved_at IS NULL DO NOTHING
		RETURNING discrepancy_id`, pgx.NamedArgs{
		"op": d.OperationID, "status": string(d.RecordedStatus), "outcome": string(d.ProviderOutcome), "source": d.Source,
		"evidence": d.Evidence, "ref": d.ProviderRef, "now": now,
	}).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("payments: record discrepancy of %s: %w", d.OperationID, err)
	}
	return true, nil
}

// hasOpenDiscrepancy reports whether the payment has an open discrepancy.
func hasOpenDiscrepancy(ctx context.Context, q db.RowQuerier, op uuid.UUID) (bool, error) {
	var open bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM payment_discrepancy WHERE operation_id = $1 AND resolved_at IS NULL)`, op).Scan(&open); err != nil {
		return false, fmt.Errorf("payments: open discrepancy of %s: %w", op, err)
	}
	return open, nil
}

const discrepancyCols = `discrepancy_id, operation_id, recorded_status, provider_outcome, source, evidence,
	coalesce(provider_ref, ''), detected_at, resolved_at, coalesce(resolved_by, ''), coalesce(resolution, '')`

func scanDiscrepancy(row pgx.Row) (Discrepancy, error) {
	var d Discrepancy
	var status, outcome string
	err := row.Scan(&d.ID, &d.OperationID, &status, &outcome, &d.Source, &d.Evidence, &d.ProviderRef, &d.DetectedAt, &d.ResolvedAt, &d.ResolvedBy, &d.Resolution)
	if err != nil {
		return Discrepancy{}, notFound(err)
	}
	d.RecordedStatus, d.ProviderOutcome = Status(status), Outcome(outcome)
	return d, nil
}

// CountOpenDiscrepancies counts the discrepancies no operator has closed
// (O(open) on payment_discrepancy_open_idx).
func CountOpenDiscrepancies(ctx context.Context, q db.RowQuerier) (int, error) {
	var n int
	if err := q.QueryRow(ctx, `SELECT count(*) FROM payment_discrepancy WHERE resolved_at IS NULL`).Scan(&n); err != nil {
		return 0, fmt.Errorf("payments: count open discrepancies: %w", err)
	}
	return n, nil
}

// ListOpenDiscrepancies returns up to limit open discrepancies, oldest
// first (O(limit) on payment_discrepancy_open_idx).
func ListOpenDiscrepancies(ctx context.Context, q db.Querier, limit int) ([]Discrepancy, error) {
	if limit <= 0 || limit > 500 {
		limit = 50
	}
	rows, err := q.Query(ctx, `SELECT `+discrepancyCols+` FROM payment_discrepancy
		WHERE resolved_at IS NULL ORDER BY detected_at, discrepancy_id LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("payments: list open discrepancies: %w", err)
	}
	defer rows.Close()
	var out []Discrepancy
	for rows.Next() {
		d, err := scanDiscrepancy(rows)
		if err != nil {
			return nil, fmt.Errorf("payments: list open discrepancies: %w", err)
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("payments: list open discrepancies: %w", err)
	}
	return out, nil
}

// OpenDiscrepanciesOf returns a payment's open discrepancy (at most one,
// payment_discrepancy_open_op_idx), as a list for the console's page.
func OpenDiscrepanciesOf(ctx context.Context, q db.Querier, op uuid.UUID) ([]Discrepancy, error) {
	d, err := scanDiscrepancy(q.QueryRow(ctx, `SELECT `+discrepancyCols+` FROM payment_discrepancy WHERE operation_id = $1 AND resolved_at IS NULL`, op))
	switch {
	case errors.Is(err, ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("payments: open discrepancy of %s: %w", op, err)
	}
	return []Discrepancy{d}, nil
}
