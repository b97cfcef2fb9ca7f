package payments

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/payments/provider"
)

// RunWorkers runs the recovery, reconcile and expiry loops until ctx ends.
func (s *Service) RunWorkers(ctx context.Context) error {
	loops := []struct {
		name  string
		every time.Duration
		pass  func(context.Context) (int, error)
	}{
		{"recovery", s.cfg.RecoveryInterval, s.RecoverOnce},
		{"reconcile", s.cfg.ReconcileInterval, s.ReconcileOnce},
		{"expiry", s.cfg.ExpiryInterval, s.PruneOnce},
	}
	done := make(chan struct{}, len(loops))
	for _, l := range loops {
		go func() {
			defer func() { done <- struct{}{} }()
			t := time.NewTicker(l.every)
			defer t.Stop()
			for {
				if n, err := l.pass(ctx); err != nil && ctx.Err() == nil {
					s.log.Error("payments: worker pass", "worker", l.name, "err", err)
				} else if n > 0 {
					s.log.Info("payments: worker pass", "worker", l.name, "rows", n)
				}
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
	}
	for range loops {
		<-done
	}
	return nil
}

// RecoverOnce takes over keys whose owner died. A key without a payment row
// is released: nothing happened and nothing can have been charged (the
// provider is only called after the payment commits), so the client's retry
// with the same key runs the payment from the start. (The service takes a
// key and writes its payment in one transaction, so it leaves no such key
// itself; versions that committed the key first did, when their owner died
// in between, and keys written by them may still be in the table.) A key with a
// processing payment is claimed atomically, and its outcome is asked from
// the provider before anything else: never a blind second charge.
func (s *Service) RecoverOnce(ctx context.Context) (int, error) {
	// The lease is the fence (settle checks it, row-locked), and this DELETE
	// re-checks it after waiting.
	// Leases are compared on the database clock (dbNow), not this host's.
	tag, err := s.pool.Exec(ctx, `
		DELETE FROM idempotency_record r
		WHERE r.ctid IN (
			SELECT ctid FROM idempotency_record
			WHERE status = 'processing' AND locked_until < `+dbNow+`
			ORDER BY locked_until LIMIT @batch)
		  AND r.status = 'processing' AND r.locked_until < `+dbNow+`
		  AND NOT EXISTS (SELECT 1 FROM payment p WHERE p.operation_id = r.operation_id)`,
		pgx.NamedArgs{"now": s.nowArg(), "batch": s.cfg.Batch})
	if err != nil {
		return 0, fmt.Errorf("payments: release orphaned keys: %w", err)
	}
	n := int(tag.RowsAffected())
	rows, err := s.pool.Query(ctx, `
		UPDATE idempotency_record r SET locked_until = t.now + @lease::bigint * interval '1 microsecond', updated_at = t.now
		FROM (SELECT `+dbNow+` AS now) t
		WHERE (r.merchant_id, r.idempotency_key) IN (
			SELECT merchant_id, idempotency_key FROM idempotency_record
			WHERE status = 'processing' AND locked_until < t.now
			ORDER BY locked_until LIMIT @batch
			FOR UPDATE SKIP LOCKED)
		  AND r.status = 'processing' AND r.locked_until < t.now
		  AND EXISTS (SELECT 1 FROM payment p WHERE p.operation_id = r.operation_id)
		RETURNING r.operation_id, r.locked_until`,
		pgx.NamedArgs{"now": s.nowArg(), "lease": s.cfg.Lease.Microseconds(), "batch": s.cfg.Batch})
	if err != nil {
		return n, fmt.Errorf("payments: claim expired leases: %w", err)
	}
	type claim struct {
		op    uuid.UUID
		lease time.Time
	}
	var claims []claim
	for rows.Next() {
		var c claim
		if err := rows.Scan(&c.op, &c.lease); err != nil {
			rows.Close()
			return n, fmt.Errorf("payments: claim expired leases: %w", err)
		}
		claims = append(claims, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return n, fmt.Errorf("payments: claim expired leases: %w", err)
	}
	var errs []error
	for _, c := range claims {
		if err := s.recoverOne(ctx, c.op, c.lease); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

func (s *Service) recoverOne(ctx context.Context, op uuid.UUID, lease time.Time) error {
	p, err := Get(ctx, s.pool, op)
	if err != nil {
		return fmt.Errorf("payments: recover %s: %w", op, err)
	}
	if p.Status != StatusProcessing {
		return nil
	}
	res, err := s.inquire(ctx, p)
	to, d := StatusUnknown, details{}
	var charged *callRecord // written by settle
	switch {
	case err == nil && res.Outcome.Definite():
		to, d = outcomeOfCharge(res, nil)
	case err == nil && res.Outcome == provider.NotFound:
		// The provider never saw the charge: send it now, with the same
		// operation id, so a late first attempt cannot charge twice.
		cres, call, cerr := s.charge(ctx, provider.ChargeRequest{OperationID: p.OperationID, Amount: p.Amount, Currency: p.Currency})
		if errors.Is(cerr, provider.ErrNotProcessed) {
			// Nothing moved and nothing is known to be final: keep the key
			// processing; the next lease expiry tries again.
			s.recordCall(ctx, op, call)
			return nil
		}
		to, d = outcomeOfCharge(cres, cerr)
		charged = &call
	}
	s.log.Info("payments: recovered", "operation_id", op, "status", to)
	_, err = s.settle(ctx, op, StatusProcessing, to, d, &lease, charged)
	if errors.Is(err, ErrLeaseLost) || errors.Is(err, errStateChanged) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("payments: recover %s: %w", op, err)
	}
	return nil
}

// ReconcileOnce inquires the provider about unknown payments that are due,
// with exponential backoff per payment. A definite answer resolves the
// payment once; no answer (unknown, not found, an error) leaves it unknown
// and its reservation active. It also refreshes the unknown gauges.
func (s *Service) ReconcileOnce(ctx context.Context) (int, error) {
	var errs []error
	n, err := s.inquireDue(ctx, "unknown payments", `
		SELECT operation_id FROM payment
		WHERE status = 'unknown' AND (next_inquiry_at IS NULL OR next_inquiry_at <= `+dbNow+`)
		ORDER BY unknown_since, operation_id LIMIT @batch`, func(r InquiryReport) bool { return r.Resolved })
	if err != nil {
		errs = append(errs, err)
	}
	checked, err := s.checkFailed(ctx)
	n += checked
	if err != nil {
		errs = append(errs, err)
	}
	if err := s.RefreshGauges(ctx); err != nil {
		errs = append(errs, err)
	}
	return n, errors.Join(errs...)
}

// inquireDue inquires every payment dueSQL lists (its operation ids; @now
// and @batch are bound) and returns how many reports counted says count.
// One payment's failed inquiry does not stop the others.
func (s *Service) inquireDue(ctx context.Context, what, dueSQL string, counted func(InquiryReport) bool) (int, error) {
	rows, err := s.pool.Query(ctx, dueSQL, pgx.NamedArgs{"now": s.nowArg(), "batch": s.cfg.Batch})
	if err != nil {
		return 0, fmt.Errorf("payments: list %s to inquire: %w", what, err)
	}
	ops, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return 0, fmt.Errorf("payments: list %s to inquire: %w", what, err)
	}
	n := 0
	var errs []error
	for _, op := range ops {
		rep, err := s.Inquire(ctx, op)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if counted(rep) {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// failedChecks bounds the inquiries of a payment failed as
// provider_unavailable (at InquiryBackoff, then doubling): enough to catch a
// provider that said "unavailable" and charged anyway, without asking about
// every failed payment forever.
const failedChecks = 3

// checkFailed inquires the payments failed as provider_unavailable whose
// re-check is due (payment_failed_check_idx keeps it O(due)); a provider
// saying it charged one files a discrepancy. It returns how many
// discrepancies it filed.
func (s *Service) checkFailed(ctx context.Context) (int, error) {
	return s.inquireDue(ctx, "failed payments", `
		SELECT operation_id FROM payment
		WHERE status = 'failed' AND next_inquiry_at IS NOT NULL AND next_inquiry_at <= `+dbNow+`
		ORDER BY next_inquiry_at LIMIT @batch`, func(r InquiryReport) bool { return r.Discrepancy })
}

// InquiryReport is what an inquiry found and did.
type InquiryReport struct {
	OperationID uuid.UUID
	Answer      provider.Outcome // succeeded, declined, not_found, unknown; "" when the provider did not answer
	Error       string           // why there was no answer (no PII)
	Resolved    bool             // the payment moved out of unknown
	Discrepancy bool             // the answer contradicts a final payment and a discrepancy was filed
	Status      Status           // the payment's status afterwards
}

// Inquire asks the provider about one payment (the console's "inquire"
// action and the reconcile worker's step). An unknown payment with a
// definite answer is resolved once; otherwise its next inquiry is pushed
// back. A final payment the answer contradicts (failed here, charged
// there) gets a discrepancy and is otherwise left exactly as it is.
func (s *Service) Inquire(ctx context.Context, op uuid.UUID) (InquiryReport, error) {
	return s.InquireRecorded(ctx, op, nil)
}

// InquiryRecorder runs in the transaction that records an inquiry's
// answer (and, when the answer is definite, resolves the payment), with the
// report as it will be returned: the console writes its audit row there, so
// the action and its record commit together (invariant 11).
type InquiryRecorder func(ctx context.Context, tx pgx.Tx, rep InquiryReport) error

// InquireRecorded is Inquire with record called in the recording
// transaction (nil: none).
func (s *Service) InquireRecorded(ctx context.Context, op uuid.UUID, record InquiryRecorder) (InquiryReport, error) {
	if record == nil {
		record = func(context.Context, pgx.Tx, InquiryReport) error { return nil }
	}
	p, err := Get(ctx, s.pool, op)
	if err != nil {
		return InquiryReport{}, fmt.Errorf("payments: inquire %s: %w", op, err)
	}
	rep := InquiryReport{OperationID: op, Status: p.Status}
	res, ierr := s.inquire(ctx, p)
	answer := AnswerNone
	if ierr != nil {
		rep.Error = ierr.Error()
	} else {
		rep.Answer = res.Outcome
		answer = string(res.Outcome)
	}
	if p.Status == StatusCompleted || p.Status == StatusFailed {
		if err := db.WithTx(ctx, s.pool, func(tx pgx.Tx) error {
			if err := noteInquiry(ctx, tx, op, answer, s.nowArg()); err != nil {
				return err
			}
			return record(ctx, tx, rep)
		}); err != nil {
			return rep, err
		}
		return rep, s.inquiredFinal(ctx, p, res, ierr, &rep)
	}
	if p.Status != StatusUnknown {
		return rep, db.WithTx(ctx, s.pool, func(tx pgx.Tx) error { return record(ctx, tx, rep) })
	}
	if ierr == nil && res.Outcome.Definite() {
		outcome := OutcomeSucceeded
		if res.Outcome == provider.Declined {
			outcome = OutcomeFailed
		}
		code := ""
		if outcome == OutcomeFailed {
			code = CodeDeclined
		}
		rp, err := db.WithTxV(ctx, s.pool, func(tx pgx.Tx) (Payment, error) {
			if err := noteInquiry(ctx, tx, op, answer, s.nowArg()); err != nil {
				return Payment{}, err
			}
			p, _, err := transition(ctx, tx, op, StatusUnknown, statusOf(outcome),
				details{providerRef: res.ProviderRef, failureCode: code, resolvedBy: "inquiry"}, s.nowArg(), s.cfg.Topic)
			if err != nil {
				return p, err
			}
			resolved := rep
			resolved.Resolved, resolved.Status = true, p.Status
			return p, record(ctx, tx, resolved)
		})
		switch {
		case errors.Is(err, ErrNotUnknown):
			cur, gerr := Get(ctx, s.pool, op)
			if gerr == nil {
				rep.Status = cur.Status
			}
			return rep, nil
		case err != nil:
			return rep, fmt.Errorf("payments: resolve %s by inquiry: %w", op, err)
		}
		s.poke()
		s.m.payments.WithLabelValues(string(rp.Status)).Inc()
		rep.Resolved, rep.Status = true, rp.Status
		return rep, nil
	}
	err = db.WithTx(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `
		UPDATE payment SET inquiry_attempts = inquiry_attempts + 1, updated_at = t.now,
			next_inquiry_at = t.now + @delay::bigint * interval '1 microsecond',
			last_inquiry_at = t.now, last_inquiry_answer = @answer
		FROM (SELECT `+dbNow+` AS now) t
		WHERE operation_id = @op AND status = 'unknown'`,
			pgx.NamedArgs{"op": op, "now": s.nowArg(), "answer": answer, "delay": s.inquiryDelay(p.InquiryAttempts + 1).Microseconds()}); err != nil {
			return fmt.Errorf("payments: schedule the next inquiry of %s: %w", op, err)
		}
		return record(ctx, tx, rep)
	})
	return rep, err
}

// AnswerNone is payment.last_inquiry_answer when the provider did not
// answer an inquiry (a timeout, a refused connection); otherwise the column
// holds the provider's outcome word.
const AnswerNone = "no_answer"

// noteInquiry records when the provider was last asked about a payment and
// what it said (the console shows it on every unknown payment). It leaves
// the status, the reservation and updated_at alone.
func noteInquiry(ctx context.Context, q db.Querier, op uuid.UUID, answer string, now *time.Time) error {
	if _, err := q.Exec(ctx, `UPDATE payment SET last_inquiry_at = `+dbNow+`, last_inquiry_answer = @answer WHERE operation_id = @op`,
		pgx.NamedArgs{"op": op, "answer": answer, "now": now}); err != nil {
		return fmt.Errorf("payments: record the inquiry of %s: %w", op, err)
	}
	return nil
}

// inquiryDelay is the wait before the attempts-th next inquiry of one
// payment: the outbox's backoff (exponential, capped, jittered), so
// payments that went unknown together (a provider outage) are not all
// asked again in the same instant.
func (s *Service) inquiryDelay(attempts int) time.Duration {
	return outbox.Backoff{Base: s.cfg.InquiryBackoff, Cap: s.cfg.InquiryBackoffMax}.Delay(attempts)
}

// inquiredFinal acts on an inquiry's answer about a completed or failed
// payment: a contradiction becomes a discrepancy, and a pending re-check of
// a provider_unavailable failure is counted (ended by a definite answer or
// after failedChecks).
func (s *Service) inquiredFinal(ctx context.Context, p Payment, res provider.Result, ierr error, rep *InquiryReport) error {
	definite := ierr == nil && res.Outcome.Definite()
	if definite && contradicts(p.Status, outcomeOfProvider(res.Outcome)) {
		r, err := recordDiscrepancy(ctx, s.pool, Discrepancy{OperationID: p.OperationID, RecordedStatus: p.Status,
			ProviderOutcome: outcomeOfProvider(res.Outcome), Source: DiscrepancyInquiry, Evidence: "inquiry", ProviderRef: res.ProviderRef}, s.nowArg(), "")
		if err != nil {
			return err
		}
		created := r.State == DiscrepancyOpened
		rep.Discrepancy = created
		if created {
			s.log.Warn("payments: discrepancy: the provider contradicts a final payment", "operation_id", p.OperationID,
				"status", p.Status, "provider_says", res.Outcome, "source", DiscrepancyInquiry)
		}
	}
	if p.Status != StatusFailed || p.NextInquiryAt == nil {
		return nil
	}
	if _, err := s.pool.Exec(ctx, `
		UPDATE payment SET inquiry_attempts = inquiry_attempts + 1, updated_at = t.now,
			next_inquiry_at = CASE WHEN @definite OR inquiry_attempts + 1 >= @checks THEN NULL
			                       ELSE t.now + @delay::bigint * interval '1 microsecond' END
		FROM (SELECT `+dbNow+` AS now) t
		WHERE operation_id = @op AND status = 'failed' AND next_inquiry_at IS NOT NULL`, pgx.NamedArgs{
		"op": p.OperationID, "definite": definite, "checks": failedChecks, "now": s.nowArg(),
		"delay": s.inquiryDelay(p.InquiryAttempts + 1).Microseconds(),
	}); err != nil {
		return fmt.Errorf("payments: schedule the re-check of failed %s: %w", p.OperationID, err)
	}
	return nil
}

// RefreshGauges sets sluice_payments_unknown,
// sluice_payments_reconcile_age_seconds and sluice_payments_discrepancies
// from HealthRead, the definition the dashboard shows.
func (s *Service) RefreshGauges(ctx context.Context) error {
	r := HealthRead{Now: s.nowArg()}
	if _, err := db.ReadAll(ctx, s.pool, &r); err != nil {
		return fmt.Errorf("payments: refresh gauges: %w", err)
	}
	h := r.Health
	s.m.unknown.Set(float64(h.Unknown))
	s.m.reconcileAge.Set(h.ReconcileAge.Seconds())
	s.m.discrepancy.Set(float64(h.Discrepancies))
	return nil
}

// PruneOnce deletes idempotency records past their retry window, in
// batches. Payments (business uniqueness) and the ledger are kept; a key
// still processing is left to recovery.
func (s *Service) PruneOnce(ctx context.Context) (int, error) {
	cutoff, err := s.clockNow(ctx)
	if err != nil {
		return 0, fmt.Errorf("payments: prune keys: %w", err)
	}
	n, err := db.DeleteInBatches(ctx, s.pool, "payments: prune keys", `
		DELETE FROM idempotency_record WHERE ctid IN (
			SELECT ctid FROM idempotency_record
			WHERE expires_at < $1 AND status <> 'processing'
			ORDER BY expires_at -- walk idempotency_record_expires_idx oldest first
			LIMIT $2)`, cutoff, s.cfg.ExpiryBatch)
	return int(n), err
}

// clockNow reads the service's clock: the injected one, or the database's.
func (s *Service) clockNow(ctx context.Context) (time.Time, error) {
	var now time.Time
	err := s.pool.QueryRow(ctx, `SELECT `+dbNow, pgx.NamedArgs{"now": s.nowArg()}).Scan(&now)
	return now, err
}
