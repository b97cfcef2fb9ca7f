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

// CallInquire is ProviderCall.Op of an inquiry (the other is "charge").
const CallInquire = "inquire"

// ProviderCallsShown is the most calls ProviderCalls returns: the oldest
// ones; a payment with more has them cut.
const ProviderCallsShown = 200

// maxCallError bounds a recorded call error (a transport error, never
// customer data).
const maxCallError = 300

// callRecord is one provider call not yet written down: recordCall writes
// it on its own, settle in the transaction that records its outcome (one
// commit less per payment).
type callRecord struct {
	kind string // charge or inquire
	d    time.Duration
	end  time.Time // when the answer came, on this host's monotonic clock
	res  provider.Result
	err  error
	// maybeRecorded: a statement that records the call may have committed
	// with its answer lost (settleOwned's fallback), so recording it again
	// checks first (callUnrecorded). Never set otherwise: fast failures
	// share durations to the microsecond, and a genuine second call with
	// the same answer must be kept.
	maybeRecorded bool
}

// insertCallSQL inserts the call @op; its start is the statement's time
// (dbNow) less the call's duration and the time since it ended (@ago).
// The caller appends its WHERE or ends the statement.
const insertCallSQL = `
	INSERT INTO payment_provider_call (operation_id, op, started_at, duration_us, answer, error)
	SELECT @op, @kind, ` + dbNow + ` - (@us::bigint + @ago::bigint) * interval '1 microsecond', @us, @answer, @error`

// callUnrecorded is a condition for insertCallSQL's WHERE: the call is not
// in the table yet. A statement whose answer was lost (its connection cut
// after COMMIT) may have recorded the call already, and the fallbacks that
// then record it again (settle, recordCall) must not make one charge read
// as two in the payment's trace, where operators judge whether it was
// sent. The same kind, answer and duration to the microsecond is the same
// call: durations come from this host's monotonic clock.
const callUnrecorded = `NOT EXISTS (SELECT 1 FROM payment_provider_call c
	WHERE c.operation_id = @op AND c.op = @kind AND c.duration_us = @us
	  AND c.answer IS NOT DISTINCT FROM @answer AND c.error IS NOT DISTINCT FROM @error)`

// insertCallOnce is insertCallSQL, guarded by callUnrecorded when the call
// may be in the table already.
func insertCallOnce(c callRecord) string {
	if c.maybeRecorded {
		return insertCallSQL + ` WHERE ` + callUnrecorded
	}
	return insertCallSQL
}

// callArgs are insertCallSQL's arguments (op and now included).
func (s *Service) callArgs(op uuid.UUID, c callRecord) pgx.NamedArgs {
	var answer, errText *string
	if c.err == nil {
		a := string(c.res.Outcome)
		answer = &a
	} else {
		e := c.err.Error()
		if len(e) > maxCallError {
			e = e[:maxCallError]
		}
		errText = &e
	}
	return pgx.NamedArgs{"op": op, "kind": c.kind, "now": s.nowArg(), "us": c.d.Microseconds(), "ago": time.Since(c.end).Microseconds(),
		"answer": answer, "error": errText}
}

// recordCall keeps one provider call on its own. Recording must never
// change a payment's course, so a failure is logged, not returned; the
// call's start is on the database clock (its end, less the measured
// duration).
func (s *Service) recordCall(ctx context.Context, op uuid.UUID, c callRecord) {
	if _, err := s.pool.Exec(context.WithoutCancel(ctx), insertCallOnce(c), s.callArgs(op, c)); err != nil {
		s.log.Warn("payments: record a provider call", "operation_id", op, "op", c.kind, "err", err)
	}
}

// ProviderCalls lists a payment's provider calls, oldest first.
func ProviderCalls(ctx context.Context, q db.Querier, op uuid.UUID) ([]ProviderCall, error) {
	rows, err := q.Query(ctx, `SELECT call_id, operation_id, op, started_at, duration_us, coalesce(answer, ''), coalesce(error, '')
		FROM payment_provider_call WHERE operation_id = $1 ORDER BY call_id LIMIT $2`, op, ProviderCallsShown)
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

// andOrWhere continues insertCallOnce's statement with a condition: AND
// after its guard, WHERE without one.
func andOrWhere(guarded bool) string {
	if guarded {
		return "AND"
	}
	return "WHERE"
}
