package payments

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/internal/db"
)

// UnknownPayment is a payment whose outcome is not known yet (no customer
// data: summaries carry no PII).
type UnknownPayment struct {
	OperationID  string    `json:"operation_id"`
	Amount       string    `json:"amount"`
	Currency     string    `json:"currency"`
	UnknownSince time.Time `json:"unknown_since"`
}

// Health is what on-call watches in the payments room, each number with
// one definition shared by the dashboard, /metrics (sluice_payments_unknown,
// sluice_payments_reconcile_age_seconds, sluice_idempotency_stuck_processing,
// sluice_payments_discrepancies), the demo and the list pages.
type Health struct {
	Unknown         int64            `json:"unknown"`          // payments whose outcome is not known
	ReconcileAge    time.Duration    `json:"-"`                // now() − unknown_since of the oldest unknown payment
	StuckProcessing int64            `json:"stuck_processing"` // processing keys whose lease expired (recovery's work)
	Discrepancies   int64            `json:"discrepancies"`    // open: provider and our records disagree
	RecentUnknown   []UnknownPayment `json:"recent_unknown"`   // the oldest few unknown payments
}

// HealthRead reads Health through partial indexes only (unknown payments,
// processing keys, open discrepancies): O(the work on-call has), never
// O(history). Ages are on the database clock, now(), unless Now is set.
type HealthRead struct {
	Recent int        // how many of the oldest unknown payments to list
	Now    *time.Time // the clock ages and leases are measured on; nil: now() (a service's injected clock otherwise)
	Health Health
}

// Expr implements db.Read.
func (r *HealthRead) Expr(args *db.Args) string {
	now := "coalesce(" + args.Add(r.Now) + "::timestamptz, now())"
	return `SELECT json_build_object(
	    'unknown', (SELECT count(*) FROM payment WHERE status = 'unknown'),
	    'reconcile_secs', coalesce((SELECT extract(epoch FROM ` + now + ` - min(unknown_since)) FROM payment WHERE status = 'unknown'), 0),
	    'stuck_processing', (SELECT count(*) FROM idempotency_record WHERE status = 'processing' AND locked_until < ` + now + `),
	    'discrepancies', (SELECT count(*) FROM payment_discrepancy WHERE resolved_at IS NULL),
	    'recent_unknown', coalesce((SELECT json_agg(json_build_object('operation_id', operation_id, 'amount', amount::text,
	                                       'currency', currency, 'unknown_since', since) ORDER BY since, operation_id)
	                                  FROM (SELECT operation_id, amount, currency, coalesce(unknown_since, updated_at) AS since
	                                          FROM payment WHERE status = 'unknown'
	                                         ORDER BY unknown_since, operation_id LIMIT ` + db.Int(r.Recent) + `) u), '[]'))`
}

// Scan implements db.Read.
func (r *HealthRead) Scan(src []byte) error {
	var w struct {
		Health
		ReconcileSecs float64 `json:"reconcile_secs"`
	}
	if err := db.ScanJSON(src, &w); err != nil {
		return fmt.Errorf("payments: health: %w", err)
	}
	r.Health = w.Health
	r.Health.ReconcileAge = time.Duration(max(w.ReconcileSecs, 0) * float64(time.Second))
	return nil
}

// ReadHealth reads Health on its own.
func ReadHealth(ctx context.Context, q db.RowQuerier, recent int) (Health, error) {
	r := HealthRead{Recent: recent}
	if _, err := db.ReadAll(ctx, q, &r); err != nil {
		return Health{}, fmt.Errorf("payments: health: %w", err)
	}
	return r.Health, nil
}
