package payments

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/payments/provider"
)

// ProviderCall is one call to the provider about a payment, as it went.
type ProviderCall struct {
	ID          int64
	OperationID uuid.UUID
	Op          string // charge or inquire
	StartedAt   time.Time
	Duration    time.Duration
	Answer      string // the provider's outcome word; "" when it did not answer
	Error       string // why there was no answer
}

// maxCallError bounds a recorded call error (a transport error, never
// customer data).
const maxCallError = 300

// recordCall keeps one provider call. Recording must never change a
// payment's course, so a failure is logged, not returned; the call's start
// is on the database clock (its end, less the measured duration).
func (s *Service) recordCall(ctx context.Context, op uuid.UUID, kind string, d time.Duration, res provider.Result, callErr error) {
	var answer, errText *string
	if callErr == nil {
		a := string(res.Outcome)
		answer = &a
	} else {
		e := callErr.Error()
		if len(e) > maxCallError {
			e = e[:maxCallError]
		}
		errText = &e
	}
	_, err := s.pool.Exec(context.WithoutCancel(ctx), `
		INSERT INTO payment_provider_call (operation_id, op, started_at, duration_us, answer, error)
		VALUES (@op, @kind, `+dbNow+` - @us::bigint * interval '1 microsecond', @us, @answer, @error)`,
		pgx.NamedArgs{"op": op, "kind": kind, "now": s.nowArg(), "us": d.Microseconds(), "answer": answer, "error": errText})
	if err != nil {
		s.log.Warn("payments: record a provider call", "operation_id", op, "op", kind, "err", err)
	}
}

// ProviderCalls lists a payment's provider calls, oldest first.
func ProviderCalls(ctx context.Context, q db.Querier, op uuid.UUID) ([]ProviderCall, error) {
	rows, err := q.Query(ctx, `SELECT call_id, operation_id, op, started_at, duration_us, coalesce(answer, ''), coalesce(error, '')
		FROM payment_provider_call WHERE operation_id = $1 ORDER BY call_id LIMIT 200`, op)
	if err != nil {
		return nil, fmt.Errorf("payments: provider calls of %s: %w", op, err)
	}
	calls, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ProviderCall, error) {
		var c ProviderCall
		var us int64
		err := r.Scan(&c.ID, &c.OperationID, &c.Op, &c.StartedAt, &us, &c.Answer, &c.Error)
		c.Duration = time.Duration(us) * time.Microsecond
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("payments: provider calls of %s: %w", op, err)
	}
	return calls, nil
}
