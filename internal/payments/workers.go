package payments

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
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
	if s.clk != nil {
		// Sync before the first recovery pass compares leases.
		if _, err := s.clk.sync(ctx, s.pool); err != nil && ctx.Err() == nil {
			s.log.Warn("payments: sync clock with the database", "err", err)
		}
		loops = append(loops, struct {
			name  string
			every time.Duration
			pass  func(context.Context) (int, error)
		}{"clock", 30 * time.Second, func(ctx context.Context) (int, error) { return s.clk.sync(ctx, s.pool) }})
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
// (the owner died between the ownership commit and the reserve transaction)
// is released: nothing happened and nothing can have been charged (the
// provider is only called after the payment commits), so the client's retry
// with the same key runs the payment from the start. A key with a
// processing payment is claimed atomically, and its outcome is asked from
// the provider before anything else: never a blind second charge.
func (s *Service) RecoverOnce(ctx context.Context) (int, error) {
	now := s.now()
	// The lease is the fence: an owner still alive extends it in its reserve
	// transaction (row-locked), and this DELETE re-checks it after waiting.
	tag, err := s.pool.Exec(ctx, `
		DELETE FROM idempotency_record r
		WHERE r.ctid IN (
			SELECT ctid FROM idempotency_record
			WHERE status = 'processing' AND locked_until < $1
			ORDER BY locked_until LIMIT $2)
		  AND r.status = 'processing' AND r.locked_until < $1
		  AND NOT EXISTS (SELECT 1 FROM payment p WHERE p.operation_id = r.operation_id)`, now, s.cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("payments: release orphaned keys: %w", err)
	}
	n := int(tag.RowsAffected())
	rows, err := s.pool.Query(ctx, `
		UPDATE idempotency_record r SET locked_until = $2, updated_at = $1
		WHERE (r.merchant_id, r.idempotency_key) IN (
			SELECT merchant_id, idempotency_key FROM idempotency_record
			WHERE status = 'processing' AND locked_until < $1
			ORDER BY locked_until LIMIT $3
			FOR UPDATE SKIP LOCKED)
		  AND r.status = 'processing' AND r.locked_until < $1
		  AND EXISTS (SELECT 1 FROM payment p WHERE p.operation_id = r.operation_id)
		RETURNING r.operation_id, r.locked_until`, now, now.Add(s.cfg.Lease), s.cfg.Batch)
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
			return n, err
		}
		claims = append(claims, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return n, err
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
		return err
	}
	if p.Status != StatusProcessing {
		return nil
	}
	res, err := s.inquire(ctx, p)
	to, d := StatusUnknown, details{}
	switch {
	case err == nil && res.Outcome.Definite():
		to, d = outcomeOfCharge(res, nil)
	case err == nil && res.Outcome == provider.NotFound:
		// The provider never saw the charge: send it now, with the same
		// operation id, so a late first attempt cannot charge twice.
		cres, cerr := s.charge(ctx, provider.ChargeRequest{OperationID: p.OperationID, Amount: p.Amount, Currency: p.Currency})
		if errors.Is(cerr, provider.ErrNotProcessed) {
			// Nothing moved and nothing is known to be final: keep the key
			// processing; the next lease expiry tries again.
			return nil
		}
		to, d = outcomeOfCharge(cres, cerr)
	}
	s.log.Info("payments: recovered", "operation_id", op, "status", to)
	_, err = s.settle(ctx, op, StatusProcessing, to, d, &lease)
	if errors.Is(err, ErrLeaseLost) || errors.Is(err, errStateChanged) {
		return nil
	}
	return err
}

// ReconcileOnce inquires the provider about unknown payments that are due,
// with exponential backoff per payment. A definite answer resolves the
// payment once; no answer (unknown, not found, an error) leaves it unknown
// and its reservation active. It also refreshes the unknown gauges.
func (s *Service) ReconcileOnce(ctx context.Context) (int, error) {
	now := s.now()
	rows, err := s.pool.Query(ctx, `
		SELECT operation_id FROM payment
		WHERE status = 'unknown' AND (next_inquiry_at IS NULL OR next_inquiry_at <= $1)
		ORDER BY unknown_since, operation_id LIMIT $2`, now, s.cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("payments: list unknown: %w", err)
	}
	var ops []uuid.UUID
	for rows.Next() {
		var op uuid.UUID
		if err := rows.Scan(&op); err != nil {
			rows.Close()
			return 0, err
		}
		ops = append(ops, op)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, op := range ops {
		rep, err := s.Inquire(ctx, op)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if rep.Resolved {
			n++
		}
	}
	checked, err := s.checkFailed(ctx, now)
	n += checked
	if err != nil {
		errs = append(errs, err)
	}
	if err := s.RefreshGauges(ctx); err != nil {
		errs = append(errs, err)
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
func (s *Service) checkFailed(ctx context.Context, now time.Time) (int, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT operation_id FROM payment
		WHERE status = 'failed' AND next_inquiry_at IS NOT NULL AND next_inquiry_at <= $1
		ORDER BY next_inquiry_at LIMIT $2`, now, s.cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("payments: list failed payments to re-check: %w", err)
	}
	ops, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return 0, fmt.Errorf("payments: list failed payments to re-check: %w", err)
	}
	n := 0
	var errs []error
	for _, op := range ops {
		rep, err := s.Inquire(ctx, op)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if rep.Discrepancy {
			n++
		}
	}
	return n, errors.Join(errs...)
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
	p, err := Get(ctx, s.pool, op)
	if err != nil {
		return InquiryReport{}, err
	}
	rep := InquiryReport{OperationID: op, Status: p.Status}
	res, ierr := s.inquire(ctx, p)
	if ierr != nil {
		rep.Error = ierr.Error()
	} else {
		rep.Answer = res.Outcome
	}
	now := s.now()
	if p.Status == StatusCompleted || p.Status == StatusFailed {
		return rep, s.inquiredFinal(ctx, p, res, ierr, now, &rep)
	}
	if p.Status != StatusUnknown {
		return rep, nil
	}
	if ierr == nil && res.Outcome.Definite() {
		outcome := OutcomeSucceeded
		if res.Outcome == provider.Declined {
			outcome = OutcomeFailed
		}
		var rp Payment
		err := db.WithTx(ctx, s.pool, func(tx pgx.Tx) error {
			var err error
			code := ""
			if outcome == OutcomeFailed {
				code = CodeDeclined
			}
			rp, err = Resolve(ctx, tx, op, outcome, ResolveOptions{ProviderRef: res.ProviderRef, FailureCode: code, ResolvedBy: "inquiry", Topic: s.cfg.Topic, Now: now})
			return err
		})
		switch {
		case errors.Is(err, ErrNotUnknown):
			cur, gerr := Get(ctx, s.pool, op)
			if gerr == nil {
				rep.Status = cur.Status
			}
			return rep, nil
		case err != nil:
			return rep, err
		}
		s.m.payments.WithLabelValues(string(rp.Status)).Inc()
		rep.Resolved, rep.Status = true, rp.Status
		return rep, nil
	}
	next := now.Add(backoff(s.cfg.InquiryBackoff, s.cfg.InquiryBackoffMax, p.InquiryAttempts+1))
	_, err = s.pool.Exec(ctx, `
		UPDATE payment SET inquiry_attempts = inquiry_attempts + 1, next_inquiry_at = $2, updated_at = $3
		WHERE operation_id = $1 AND status = 'unknown'`, op, next, now)
	return rep, err
}

// inquiredFinal acts on an inquiry's answer about a completed or failed
// payment: a contradiction becomes a discrepancy, and a pending re-check of
// a provider_unavailable failure is counted (ended by a definite answer or
// after failedChecks).
func (s *Service) inquiredFinal(ctx context.Context, p Payment, res provider.Result, ierr error, now time.Time, rep *InquiryReport) error {
	definite := ierr == nil && res.Outcome.Definite()
	if definite && contradicts(p.Status, outcomeOfProvider(res.Outcome)) {
		created, err := recordDiscrepancy(ctx, s.pool, Discrepancy{OperationID: p.OperationID, RecordedStatus: p.Status,
			ProviderOutcome: outcomeOfProvider(res.Outcome), Source: DiscrepancyInquiry, Evidence: "inquiry", ProviderRef: res.ProviderRef, DetectedAt: now})
		if err != nil {
			return err
		}
		rep.Discrepancy = created
		if created {
			s.log.Warn("payments: discrepancy: the provider contradicts a final payment", "operation_id", p.OperationID,
				"status", p.Status, "provider_says", res.Outcome, "source", DiscrepancyInquiry)
		}
	}
	if p.Status != StatusFailed || p.NextInquiryAt == nil {
		return nil
	}
	next := now.Add(backoff(s.cfg.InquiryBackoff, s.cfg.InquiryBackoffMax, p.InquiryAttempts+1))
	if _, err := s.pool.Exec(ctx, `
		UPDATE payment SET inquiry_attempts = inquiry_attempts + 1, updated_at = $4,
			next_inquiry_at = CASE WHEN $2 OR inquiry_attempts + 1 >= $5 THEN NULL ELSE $3::timestamptz END
		WHERE operation_id = $1 AND status = 'failed' AND next_inquiry_at IS NOT NULL`, p.OperationID, definite, next, now, failedChecks); err != nil {
		return fmt.Errorf("payments: schedule the re-check of failed %s: %w", p.OperationID, err)
	}
	return nil
}

// backoff is base·2^(attempt-1), capped.
func backoff(base, max time.Duration, attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	f := float64(base) * math.Pow(2, float64(attempt-1))
	if f > float64(max) || math.IsInf(f, 0) {
		return max
	}
	return time.Duration(f)
}

// UnknownStats is the count of unknown payments and the oldest one's age.
type UnknownStats struct {
	Count     int
	OldestAge time.Duration
}

// Unknown reads UnknownStats (O(unknown) via the partial index).
func (s *Service) Unknown(ctx context.Context) (UnknownStats, error) {
	var st UnknownStats
	var oldest *time.Time
	if err := s.pool.QueryRow(ctx, `SELECT count(*), min(unknown_since) FROM payment WHERE status = 'unknown'`).Scan(&st.Count, &oldest); err != nil {
		return st, err
	}
	if oldest != nil {
		st.OldestAge = max(s.now().Sub(*oldest), 0)
	}
	return st, nil
}

// RefreshGauges sets sluice_payments_unknown,
// sluice_payments_reconcile_age_seconds and sluice_payments_discrepancies.
func (s *Service) RefreshGauges(ctx context.Context) error {
	st, err := s.Unknown(ctx)
	if err != nil {
		return err
	}
	s.m.unknown.Set(float64(st.Count))
	s.m.reconcileAge.Set(st.OldestAge.Seconds())
	open, err := CountOpenDiscrepancies(ctx, s.pool)
	if err != nil {
		return err
	}
	s.m.discrepancy.Set(float64(open))
	return nil
}

// PruneOnce deletes idempotency records past their retry window, in
// batches. Payments (business uniqueness) and the ledger are kept; a key
// still processing is left to recovery.
func (s *Service) PruneOnce(ctx context.Context) (int, error) {
	total := 0
	for {
		tag, err := s.pool.Exec(ctx, `
			DELETE FROM idempotency_record WHERE ctid IN (
				SELECT ctid FROM idempotency_record
				WHERE expires_at < $1 AND status <> 'processing'
				ORDER BY expires_at -- walk idempotency_record_expires_idx oldest first
				LIMIT $2)`, s.now(), s.cfg.ExpiryBatch)
		if err != nil {
			return total, fmt.Errorf("payments: prune keys: %w", err)
		}
		total += int(tag.RowsAffected())
		if int(tag.RowsAffected()) < s.cfg.ExpiryBatch || ctx.Err() != nil {
			return total, ctx.Err()
		}
	}
}
