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
	"github.com/sluice-dev/sluice/internal/payments/provider"
	"github.com/sluice-dev/sluice/internal/pii"
)

// Response is an answer of the API: status, JSON body, and whether it is a
// replay of a stored answer.
type Response struct {
	Status     int
	Body       []byte
	Replayed   bool
	RetryAfter int // seconds; set on 409 in progress
}

// Stable error codes of the API (the "code" field of error bodies). Every
// code, its status and what a client should do is in docs/payments-api.md.
const (
	CodeMissingKey          = "missing_idempotency_key"
	CodeInvalidKey          = "invalid_idempotency_key"
	CodeUnauthorized        = "unauthorized"
	CodeMisdirected         = "misdirected_request"
	CodeAccountForbidden    = "account_forbidden"
	CodeInProgress          = "request_in_progress"
	CodeKeyReused           = "idempotency_key_reused"
	CodeDuplicateInvoice    = "duplicate_invoice"
	CodeInsufficientFunds   = "insufficient_funds"
	CodeCurrencyMismatch    = "currency_mismatch"
	CodeDeclined            = "payment_declined"
	CodeProviderUnavailable = "provider_unavailable"
	CodePaymentFailed       = "payment_failed"
	CodeBodyTooLarge        = "body_too_large"
	CodeNotFound            = "not_found"
	CodeInternal            = "internal_error"
)

// PaymentTypeCharge is the payment_type of every payment this API makes;
// it is part of the business identity (merchant, invoice, type).
const PaymentTypeCharge = "charge"

// ErrorBody is the JSON body of every error answer.
func ErrorBody(code, message string) []byte {
	b, _ := json.Marshal(struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}{code, message})
	return b
}

// rejection is a request refused before any money could move; it becomes
// the key's stored result.
type rejection struct {
	status  int
	code    string
	message string
	outcome string // sluice_payments_total label
	body    []byte // the stored body when it is more than ErrorBody(code, message)
}

// DuplicateBody is the answer to a payment of an invoice that already has
// a live attempt (processing, unknown or completed) under another key: 422
// duplicate_invoice, final, naming the attempt that holds the invoice.
type DuplicateBody struct {
	Code        string `json:"code"`
	Message     string `json:"message"`
	OperationID string `json:"operation_id"`
	Status      Status `json:"status"`
	Attempt     int    `json:"attempt"`
}

// duplicateRejection words the final answer after the state of the attempt
// that holds the invoice, so that what it says is true.
func duplicateRejection(live Payment) *rejection {
	op := live.OperationID.String()
	var msg string
	switch live.Status {
	case StatusCompleted:
		msg = "this invoice was already paid by operation " + op + "; final answer: do not retry, and do not pay it again under a new Idempotency-Key"
	case StatusUnknown:
		msg = "this invoice is being paid by operation " + op + ", whose outcome the provider has not confirmed yet; final answer: do not pay it again, follow that operation with GET /v1/payments/" + op
	default:
		msg = "this invoice is being paid by operation " + op + ", still in progress; final answer: do not pay it again, follow that operation with GET /v1/payments/" + op
	}
	b, _ := json.Marshal(DuplicateBody{Code: CodeDuplicateInvoice, Message: msg, OperationID: op, Status: live.Status, Attempt: live.Attempt})
	return &rejection{status: 422, code: CodeDuplicateInvoice, message: msg, outcome: "rejected", body: b}
}

// errInvoiceTaken: the payment insert met a live or concurrent attempt of
// the same invoice (the transaction is rolled back).
var errInvoiceTaken = errors.New("payments: invoice has another attempt")

func (r *rejection) Error() string { return r.code }

// Create runs one POST /v1/payments for (merchant, key). It never returns
// an error for a client mistake: those are answers. An error means the
// service could not answer (the key stays processing and recovery takes it
// over when its lease ends).
func (s *Service) Create(ctx context.Context, merchantID, key string, req Request) (Response, error) {
	resp, err := s.create(ctx, merchantID, key, req)
	if err == nil && resp.Replayed {
		s.m.replays.Inc()
	}
	return resp, err
}

func (s *Service) create(ctx context.Context, merchantID, key string, req Request) (Response, error) {
	hash := req.Hash(s.kr.MAC)
	op, err := uuid.NewV7()
	if err != nil {
		return Response{}, fmt.Errorf("payments: new operation id: %w", err)
	}
	// Sealing needs no database: it is done before the transaction, which
	// then holds its row locks for less time.
	sealed, err := s.sealCustomer(op, req.Customer)
	if err != nil {
		return Response{}, fmt.Errorf("payments: encrypt customer: %w", err)
	}
	rec := Record{MerchantID: merchantID, Key: key, RequestHash: hash, Status: StatusProcessing, OperationID: op}
	// The work belongs to the key from the moment its reserve may commit,
	// not to the HTTP request: a client that hangs up must not cut it half
	// way. pgx cancels a statement by closing its connection, and the error
	// read then says nothing of whether the COMMIT had reached the server: a
	// reservation could commit with nobody left to call the provider before
	// the lease ran out (and recovery's inquiry, answered "unknown", could
	// leave a charge never sent as unknown). So the request runs on its own
	// clock, the lease (a reserve slower than that is lost anyway), and an
	// error that is not an answer is checked against the database (adopt).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.Lease)
	defer cancel()
	for try := 0; try < 4; try++ {
		p, lease, err := s.reserveFast(ctx, rec, req, sealed)
		var rej *rejection
		switch {
		case err == nil:
			return s.own(context.WithoutCancel(ctx), p, lease)
		case errors.Is(err, errKeyTaken):
			other, err := GetRecord(ctx, s.pool, merchantID, key)
			if errors.Is(err, ErrNotFound) {
				continue // pruned, released or rolled back between the two statements: try again
			}
			if err != nil {
				return Response{}, fmt.Errorf("payments: read the key's record: %w", err)
			}
			return s.answerFromRecord(other, hash), nil
		case errors.Is(err, errInvoiceTaken):
			// The invoice's unique indexes decided between racing keys: this
			// one answers with the attempt that holds the invoice, or, when
			// that attempt has failed meanwhile, tries again as the next one.
			live, err := LiveAttempt(ctx, s.pool, merchantID, req.InvoiceID, PaymentTypeCharge)
			if errors.Is(err, ErrNotFound) {
				continue
			}
			if err != nil {
				return Response{}, fmt.Errorf("payments: read the invoice's live attempt: %w", err)
			}
			rej = duplicateRejection(live)
		case !errors.As(err, &rej):
			if resp, ok, aerr := s.adopt(ctx, op, hash, err); ok {
				return resp, aerr
			}
			return Response{}, err
		}
		return s.reject(ctx, rec, rej)
	}
	return Response{}, errors.New("payments: the key or the invoice's attempts kept changing")
}

// adopt finds out whether a reserve that failed without an answer (its
// connection lost, a timeout) committed all the same. The operation id is
// this request's own, so a record under it is this request's reservation:
// still processing under the lease the reserve gave it, it is owned as if
// the answer had come, and the provider is called now rather than after
// the lease; finished meanwhile, its answer is this request's. ok is false
// when nothing committed or the database cannot say: the caller answers
// with the reserve's error, and recovery takes over at the lease's end if
// the reserve did commit.
func (s *Service) adopt(ctx context.Context, op uuid.UUID, hash string, reserveErr error) (resp Response, ok bool, err error) {
	// Its own few seconds: the reserve may have failed on the request's
	// deadline, which must not stop the question whether it committed.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), adoptTimeout)
	defer cancel()
	rec, err := RecordByOperation(ctx, s.pool, op)
	if err != nil || rec.RequestHash != hash {
		return Response{}, false, nil
	}
	if rec.Status != StatusProcessing {
		return ownAnswer(s.answerFromRecord(rec, hash)), true, nil
	}
	// Only the lease the reserve wrote (created_at + Lease) is this
	// request's: recovery, taking over once it ended, writes a later one,
	// and adopting that would make two owners of one charge.
	if rec.LockedUntil == nil || !rec.LockedUntil.Equal(rec.CreatedAt.Add(s.cfg.Lease.Truncate(time.Microsecond))) {
		return Response{}, false, nil
	}
	p, err := Get(ctx, s.pool, op)
	if err != nil {
		return Response{}, false, nil
	}
	s.log.Warn("payments: the reserve's answer was lost but it committed; going on with the payment", "operation_id", op, "err", reserveErr)
	resp, err = s.own(context.WithoutCancel(ctx), p, *rec.LockedUntil)
	return resp, true, err
}

// adoptTimeout bounds adopt's reads.
const adoptTimeout = 5 * time.Second

// ownAnswer is an answer read from the key's record that is this request's
// own operation's (finished by recovery while this request's worker
// stalled, or found after a lost reserve): not a replay of an earlier
// request's.
func ownAnswer(r Response) Response {
	r.Replayed = false
	return r
}

// answerFromRecord answers a request whose key belongs to someone else.
func (s *Service) answerFromRecord(rec Record, hash string) Response {
	if hash != "" && rec.RequestHash != hash {
		s.m.conflicts.WithLabelValues(ConflictPayloadMismatch).Inc()
		return Response{Status: 422, Body: ErrorBody(CodeKeyReused, "this Idempotency-Key was used with another request; use a new key for a new payment")}
	}
	if rec.Status == StatusProcessing || rec.ResponseStatus == 0 {
		s.m.conflicts.WithLabelValues(ConflictInProgress).Inc()
		return Response{Status: 409, RetryAfter: s.cfg.RetryAfterSeconds, Body: ErrorBody(CodeInProgress, "a request with this Idempotency-Key is still being processed; retry later with the same key")}
	}
	return Response{Status: rec.ResponseStatus, Body: rec.ResponseBody, Replayed: true}
}

func (s *Service) answerCurrent(ctx context.Context, op uuid.UUID) (Response, error) {
	rec, err := RecordByOperation(ctx, s.pool, op)
	if errors.Is(err, ErrNotFound) {
		// Recovery released the key while this worker stalled: nothing was
		// written for it, and a retry with the same key starts afresh.
		return Response{Status: 409, RetryAfter: s.cfg.RetryAfterSeconds, Body: ErrorBody(CodeInProgress, "the request was interrupted; retry with the same Idempotency-Key")}, nil
	}
	if err != nil {
		return Response{}, fmt.Errorf("payments: read the record of %s: %w", op, err)
	}
	return ownAnswer(s.answerFromRecord(rec, "")), nil
}

// reject stores a rejection as the key's final answer, in a transaction of
// its own (the reserve transaction that found it rolled back, so nothing
// else of the request was written). A request with the same key that took
// the key meanwhile owns it: this one answers from its record.
func (s *Service) reject(ctx context.Context, rec Record, rej *rejection) (Response, error) {
	if rej.code == CodeDuplicateInvoice {
		s.m.conflicts.WithLabelValues(ConflictBusinessDuplicate).Inc()
	}
	s.m.payments.WithLabelValues(rej.outcome).Inc()
	body := rej.body
	if body == nil {
		body = ErrorBody(rej.code, rej.message)
	}
	stored, err := scanRecord(s.pool.QueryRow(ctx, `
		INSERT INTO idempotency_record (merchant_id, idempotency_key, request_hash, status, operation_id, response_status, response_body, locked_until, created_at, updated_at, expires_at)
		SELECT @merchant, @key, @hash, 'failed', @op, @status, @body::jsonb, NULL, t.now, t.now, t.now + @window::bigint * interval '1 microsecond'
		FROM (SELECT `+dbNow+` AS now) t
		ON CONFLICT (merchant_id, idempotency_key) DO NOTHING
		RETURNING `+recordCols, pgx.NamedArgs{
		"merchant": rec.MerchantID, "key": rec.Key, "hash": rec.RequestHash, "op": rec.OperationID, "now": s.nowArg(),
		"status": rej.status, "body": string(body), "window": s.cfg.RetryWindow.Microseconds(),
	}))
	if errors.Is(err, ErrNotFound) {
		other, err := GetRecord(ctx, s.pool, rec.MerchantID, rec.Key)
		if errors.Is(err, ErrNotFound) {
			return Response{Status: 409, RetryAfter: s.cfg.RetryAfterSeconds, Body: ErrorBody(CodeInProgress, "the request was interrupted; retry with the same Idempotency-Key")}, nil
		}
		if err != nil {
			return Response{}, fmt.Errorf("payments: read the key's record: %w", err)
		}
		return s.answerFromRecord(other, rec.RequestHash), nil
	}
	if err != nil {
		return Response{}, fmt.Errorf("payments: store the rejection of %s: %w", rec.OperationID, err)
	}
	return Response{Status: stored.ResponseStatus, Body: stored.ResponseBody}, nil
}

// own runs the payment whose reserve transaction this process just
// committed: the provider call, then the settlement.
func (s *Service) own(ctx context.Context, p Payment, lease time.Time) (Response, error) {
	if s.afterReserve != nil {
		if err := s.afterReserve(p); err != nil {
			return Response{}, fmt.Errorf("payments: after reserve: %w", err)
		}
	}
	// The provider call: outside any transaction, no row lock held, the
	// operation id as the provider's idempotency key.
	res, call, cerr := s.charge(ctx, provider.ChargeRequest{OperationID: p.OperationID, Amount: p.Amount, Currency: p.Currency})
	to, d := outcomeOfCharge(res, cerr)
	if cerr != nil {
		s.log.Warn("payments: provider charge", "operation_id", p.OperationID, "err", cerr)
	}
	stored, err := s.settleOwned(ctx, p, to, d, lease, call)
	if errors.Is(err, ErrLeaseLost) || errors.Is(err, errStateChanged) {
		return s.answerCurrent(ctx, p.OperationID)
	}
	if err != nil {
		return Response{}, err
	}
	return Response{Status: stored.ResponseStatus, Body: stored.ResponseBody}, nil
}

// outcomeOfCharge maps a provider answer to the payment's next state: only
// a definite answer completes or fails; anything unclear is unknown.
func outcomeOfCharge(res provider.Result, err error) (Status, details) {
	switch {
	case err == nil && res.Outcome == provider.Succeeded:
		return StatusCompleted, details{providerRef: res.ProviderRef}
	case err == nil && res.Outcome == provider.Declined:
		return StatusFailed, details{failureCode: CodeDeclined, providerRef: res.ProviderRef}
	case errors.Is(err, provider.ErrNotProcessed):
		return StatusFailed, details{failureCode: CodeProviderUnavailable}
	}
	return StatusUnknown, details{}
}

// sealedCustomer is what the payment row stores of its customer: the
// fields sealed for this payment (pii envelope v2, place payment/<op>), and
// the blind indexes a search looks them up by.
type sealedCustomer struct {
	fields               map[string]string
	emailBidx, taxIDBidx []byte
	clear                Customer // for the payment.requested.v1 event, sealed again for it
}

func (s *Service) sealCustomer(op uuid.UUID, c Customer) (sealedCustomer, error) {
	out := sealedCustomer{fields: map[string]string{}, clear: c}
	for field, v := range map[string]string{pii.FieldName: c.Name, pii.FieldEmail: c.Email, pii.FieldTaxID: c.TaxID} {
		if v == "" {
			continue
		}
		env, err := s.kr.Seal(CustomerPlace(op), field, v)
		if err != nil {
			return sealedCustomer{}, fmt.Errorf("payments: encrypt %s: %w", field, err)
		}
		out.fields[field] = env
	}
	out.emailBidx = s.kr.BlindIndex(pii.FieldEmail, c.Email)
	if pii.Normalize(pii.FieldTaxID, c.TaxID) != "" {
		out.taxIDBidx = s.kr.BlindIndex(pii.FieldTaxID, c.TaxID)
	}
	return out, nil
}

// reserveFast reserves in one statement when it can, else in reserve's
// transaction (which tests stop half way with afterOwnership).
func (s *Service) reserveFast(ctx context.Context, rec Record, req Request, customer sealedCustomer) (Payment, time.Time, error) {
	if s.afterOwnership == nil {
		p, lease, done, err := s.reserveOne(ctx, rec, req, customer)
		if done || err != nil {
			return p, lease, err
		}
	}
	return s.reserve(ctx, rec, req, customer)
}

// errKeyTaken: another request holds or held the key (the reserve
// transaction is rolled back; the key's record answers).
var errKeyTaken = errors.New("payments: the key has a record")

// reserve is the one transaction before the provider call: it takes the
// key (its idempotency record, processing, with a lease), checks that the
// account is the merchant's, creates the payment as the invoice's next
// attempt, reserves the balance with one conditional UPDATE and writes
// payment.requested.v1. It returns the payment and the lease. Only after it
// commits is the provider called, so a crash leaves either nothing (rolled
// back: a retry with the key starts afresh) or a payment that recovery
// takes over when the lease ends.
//
// Answers that are not payments come back as errors: errKeyTaken (another
// request's record), errInvoiceTaken (a racing or live attempt of the
// invoice holds its unique indexes) and *rejection; the transaction is then
// rolled back and the caller answers.
func (s *Service) reserve(ctx context.Context, rec Record, req Request, customer sealedCustomer) (Payment, time.Time, error) {
	args, err := s.reserveArgs(rec, req, customer)
	if err != nil {
		return Payment{}, time.Time{}, err
	}
	var p Payment
	var lease time.Time
	err = db.WithTx(ctx, s.pool, func(tx pgx.Tx) error {
		// now is the transaction's one time, read back from the record, for
		// every row and the event it writes.
		var now time.Time
		err := tx.QueryRow(ctx, takeKeySQL("(SELECT "+dbNow+" AS now) t"), args).Scan(&lease, &now)
		if errors.Is(err, pgx.ErrNoRows) {
			return errKeyTaken
		}
		if err != nil {
			return fmt.Errorf("payments: take ownership: %w", err)
		}
		if s.afterOwnership != nil {
			owned := rec
			owned.LockedUntil = &lease
			if err := s.afterOwnership(owned); err != nil {
				return fmt.Errorf("payments: after ownership: %w", err)
			}
		}
		args["at"] = now
		p, err = scanPayment(tx.QueryRow(ctx, insertPaymentSQL(
			"account a WHERE a.account_id = @account AND a.merchant_id = @merchant AND a.currency = @currency", "@at::timestamptz")+
			` RETURNING `+paymentCols, args))
		if db.Code(err) == db.CodeUniqueViolation {
			switch db.Constraint(err) {
			case "payment_business_identity", "payment_business_attempt":
				return errInvoiceTaken
			}
		}
		if errors.Is(err, ErrNotFound) {
			// The insert reads the account: it is not this merchant's, or
			// not in this currency.
			return accountRejection(ctx, tx, rec.MerchantID, req)
		}
		if err != nil {
			return fmt.Errorf("payments: insert payment: %w", err)
		}
		if s.afterPayment != nil {
			if err := s.afterPayment(p); err != nil {
				return fmt.Errorf("payments: after the payment: %w", err)
			}
		}
		ok, err := s.reserveBalance(ctx, tx, rec.OperationID, req.AccountID, req.Amount.StringFixed(2), now)
		if err != nil {
			return err
		}
		if !ok {
			return &rejection{status: 402, code: CodeInsufficientFunds, message: "the account's available balance does not cover the amount", outcome: "insufficient_funds"}
		}
		return insertEvent(ctx, tx, s.kr, s.cfg.Topic, EventRequested, p, now, &customer.clear)
	})
	if err != nil {
		var rej *rejection
		if errors.As(err, &rej) || errors.Is(err, errKeyTaken) || errors.Is(err, errInvoiceTaken) {
			return Payment{}, time.Time{}, err // answers, not failures
		}
		return Payment{}, time.Time{}, fmt.Errorf("payments: reserve %s: %w", rec.OperationID, err)
	}
	s.poke() // payment.requested.v1 is committed
	return p, lease, nil
}

// takeKeySQL inserts the key's record, processing under a lease, at t.now
// when the FROM item from (which provides t) has its row; RETURNING the
// lease and the time, or nothing when the key is taken.
func takeKeySQL(from string) string {
	return `
		INSERT INTO idempotency_record (merchant_id, idempotency_key, request_hash, status, operation_id, locked_until, created_at, updated_at, expires_at)
		SELECT @merchant, @key, @hash, 'processing', @op, t.now + @lease::bigint * interval '1 microsecond', t.now, t.now,
		       t.now + @window::bigint * interval '1 microsecond'
		FROM ` + from + `
		ON CONFLICT (merchant_id, idempotency_key) DO NOTHING
		RETURNING locked_until, created_at`
}

// insertPaymentSQL inserts the payment as its invoice's next attempt, at
// the time at, when the FROM item from has its row.
func insertPaymentSQL(from, at string) string {
	return `
		INSERT INTO payment (operation_id, merchant_id, invoice_id, payment_type, attempt, account_id, amount, currency, customer, customer_email_bidx, customer_tax_id_bidx, status, created_at, updated_at)
		SELECT @op, @merchant, @invoice, @type,
			(SELECT coalesce(max(attempt), 0) + 1 FROM payment WHERE merchant_id = @merchant AND invoice_id = @invoice AND payment_type = @type),
			@account, @amount::numeric, @currency, @customer, @email_bidx, @tax_id_bidx, 'processing', ` + at + `, ` + at + `
		FROM ` + from
}

// reserveArgs are takeKeySQL's and insertPaymentSQL's arguments.
func (s *Service) reserveArgs(rec Record, req Request, customer sealedCustomer) (pgx.NamedArgs, error) {
	custJSON, err := json.Marshal(customer.fields)
	if err != nil {
		return nil, fmt.Errorf("payments: encode customer: %w", err)
	}
	return pgx.NamedArgs{
		"merchant": rec.MerchantID, "key": rec.Key, "hash": rec.RequestHash, "op": rec.OperationID, "now": s.nowArg(),
		"lease": s.cfg.Lease.Microseconds(), "window": s.cfg.RetryWindow.Microseconds(),
		"invoice": req.InvoiceID, "type": PaymentTypeCharge, "account": req.AccountID, "amount": req.Amount.StringFixed(2), "currency": req.Currency,
		"customer": custJSON, "email_bidx": customer.emailBidx, "tax_id_bidx": customer.taxIDBidx,
	}, nil
}

// reserveOneSQL is reserve's transaction as one statement, sent on its own
// (its implicit transaction: one round trip and one commit instead of six
// statements). Each write happens only when the one before it returned its
// row: the key (rec; a key already taken stops everything here) → the
// payment, on an account of the merchant in the currency (p; an invoice
// whose unique indexes are taken makes the whole statement fail) → the
// account's row lock taken without waiting, when the account covers the
// amount (l) → the reservation (u) → its balance_reservation row (r) →
// payment.requested.v1 (ev, its attempt number and time completed here).
//
// The order is the one every path takes — the key, then the invoice, then
// the account — because a statement that waits here holds what it took
// before. The key comes before the account's lock, as in reserve's
// transaction: a statement that held the lock while it waited for a
// same-key request's uncommitted key, which waits for the lock in reserve's
// transaction, would deadlock. The invoice comes before the lock for the
// same reason: the payment insert waits for a racing attempt of the invoice
// (reserve's transaction, which then waits for the account) or for a
// settlement moving the invoice's live attempt (which then moves the
// account); holding the account's lock while waiting there deadlocked
// (TestReserveWaitsForTheInvoiceHoldingNoAccount). When the account does
// not take the reservation here (not the merchant's, another currency, not
// covered, or locked), sluice_assert refuses the key without the rest
// (SQLSTATE SL001): nothing is written, and reserve's transaction decides
// (a rejection, or a wait on a hot account's lock that it measures).
var reserveOneSQL = `
	WITH t AS (SELECT ` + dbNow + ` AS now),
	rec AS (` + takeKeySQL("t") + `),
	p AS (` + insertPaymentSQL("rec, account a WHERE a.account_id = @account AND a.merchant_id = @merchant AND a.currency = @currency", "rec.created_at") + `
		RETURNING ` + paymentCols + `),
	l AS (
		SELECT account_id FROM account
		WHERE account_id = @account AND balance - reserved >= @amount::numeric AND EXISTS (SELECT 1 FROM p)
		FOR NO KEY UPDATE SKIP LOCKED),
	u AS (
		UPDATE account SET reserved = reserved + @amount::numeric, updated_at = rec.created_at
		FROM rec WHERE account_id = (SELECT account_id FROM l) AND balance - reserved >= @amount::numeric
		RETURNING 1),
	r AS (
		INSERT INTO balance_reservation (operation_id, account_id, amount, status, created_at, updated_at)
		SELECT @op, @account, @amount::numeric, 'active', p.created_at, p.created_at FROM p WHERE EXISTS (SELECT 1 FROM u)
		RETURNING 1),
	reserved AS (SELECT p.attempt, p.created_at FROM p WHERE EXISTS (SELECT 1 FROM r)),
	` + outbox.WriteSQL("ev", "reserved", `jsonb_set(jsonb_set(@ev_payload::jsonb, '{attempt}', to_jsonb(reserved.attempt)), '{occurred_at}', `+jsonTime("reserved.created_at")+`)`) + `
	SELECT (SELECT locked_until FROM rec),
		sluice_assert(NOT EXISTS (SELECT 1 FROM rec) OR (EXISTS (SELECT 1 FROM r) AND EXISTS (SELECT 1 FROM ev)), 'reserve: the key taken without the payment'),
		p.* -- paymentCols, as RETURNING made them
	FROM (SELECT 1) AS one LEFT JOIN p ON true`

// reserveOneStmt is reserveOneSQL rewritten to $n placeholders once.
var reserveOneStmt = db.NewNamed(reserveOneSQL)

// jsonTime is the JSON string of the timestamptz expression at, in UTC with
// microseconds (RFC 3339), as the database's time completes an event.
func jsonTime(at string) string {
	return `to_jsonb(to_char(` + at + ` AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))`
}

// codeStatementRefused is sluice_assert's SQLSTATE (migration 00022).
const codeStatementRefused = "SL001"

// reserveOne is reserve in one statement (reserveOneSQL) for the common
// case. done is false when it wrote nothing and reserve's transaction must
// decide; errKeyTaken and errInvoiceTaken are answers, as reserve's.
func (s *Service) reserveOne(ctx context.Context, rec Record, req Request, customer sealedCustomer) (p Payment, lease time.Time, done bool, err error) {
	args, err := s.reserveArgs(rec, req, customer)
	if err != nil {
		return Payment{}, time.Time{}, false, err
	}
	// The event as the statement will complete it: the attempt number and
	// the time are the statement's.
	requested := Payment{OperationID: rec.OperationID, MerchantID: rec.MerchantID, InvoiceID: req.InvoiceID, AccountID: req.AccountID,
		Amount: req.Amount, Currency: req.Currency, Status: StatusProcessing}
	w, err := eventWrite(ctx, s.kr, s.cfg.Topic, EventRequested, requested, time.Time{}, &customer.clear)
	if err != nil {
		return Payment{}, time.Time{}, false, err
	}
	w.Bind(args, "ev")
	var locked *time.Time
	err = queryOne(ctx, s.pool, reserveOneStmt, args, func(row pgx.Rows) error {
		// Without a payment its columns are NULL: read the flags alone first.
		flags := make([]any, len(row.FieldDescriptions()))
		flags[0] = &locked
		if err := row.Scan(flags...); err != nil || locked == nil {
			return err
		}
		p, err = scanPayment(prefixed{row, []any{nil, nil}})
		return err
	})
	switch {
	case db.Code(err) == db.CodeUniqueViolation && (db.Constraint(err) == "payment_business_identity" || db.Constraint(err) == "payment_business_attempt"):
		return Payment{}, time.Time{}, false, errInvoiceTaken
	case db.Code(err) == codeStatementRefused:
		// The key was free but the account did not take the reservation
		// here: the statement rolled back whole, the transaction decides.
		return Payment{}, time.Time{}, false, nil
	case err != nil:
		return Payment{}, time.Time{}, false, fmt.Errorf("payments: reserve %s: %w", rec.OperationID, err)
	case locked == nil:
		return Payment{}, time.Time{}, false, errKeyTaken
	}
	s.m.reservations.Inc()
	s.poke() // payment.requested.v1 is committed
	return p, *locked, true, nil
}

// queryOne runs a statement that returns one row and hands the row to
// scan; the statement's error counts even after its row came (the WITH
// items of a writing statement finish, and its constraints are checked,
// after the row is sent), and then whatever scan read is void.
func queryOne(ctx context.Context, q db.Querier, st db.Named, args pgx.NamedArgs, scan func(pgx.Rows) error) error {
	rows, err := q.Query(ctx, st.SQL(), st.Args(args)...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	serr := scan(rows)
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	return serr
}

// prefixed scans leading columns into dest before the row's own scanner
// takes the rest (a payment after reserveOneSQL's flags).
type prefixed struct {
	row  pgx.Row
	dest []any
}

func (r prefixed) Scan(dest ...any) error { return r.row.Scan(append(r.dest, dest...)...) }

// accountRejection says why the payment insert found no account: one
// answer whether the account is another merchant's or does not exist at
// all (a merchant learns nothing about others' accounts), another when it
// is the merchant's but kept in another currency.
func accountRejection(ctx context.Context, tx pgx.Tx, merchantID string, req Request) error {
	var currency string
	err := tx.QueryRow(ctx, `SELECT currency FROM account WHERE account_id = $1 AND merchant_id = $2`, req.AccountID, merchantID).Scan(&currency)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return &rejection{status: 403, code: CodeAccountForbidden, message: "the account is not one of this merchant's accounts", outcome: "rejected"}
	case err != nil:
		return fmt.Errorf("payments: read account %d: %w", req.AccountID, err)
	case currency != req.Currency:
		return &rejection{status: 422, code: CodeCurrencyMismatch, message: "the account is kept in another currency", outcome: "rejected"}
	}
	return fmt.Errorf("payments: account %d of %s took no payment in %s", req.AccountID, merchantID, req.Currency)
}

// reserveBalance is the balance invariant in one conditional UPDATE: the
// row lock makes a concurrent reservation wait and re-check against the new
// value. It first tries the row lock without waiting, so that a wait — a
// hot account — is seen and measured (sluice_payments_reservations_contended_total,
// sluice_payments_reservation_lock_wait_seconds) without naming the account.
// A reservation that succeeds writes its balance_reservation row (op's), in
// the same statement on the uncontended path.
func (s *Service) reserveBalance(ctx context.Context, tx pgx.Tx, op uuid.UUID, account int64, amount string, now time.Time) (bool, error) {
	var locked, reserved bool
	err := tx.QueryRow(ctx, `
		WITH l AS (SELECT account_id FROM account WHERE account_id = $1 FOR NO KEY UPDATE SKIP LOCKED),
		u AS (
			UPDATE account SET reserved = reserved + $2::numeric, updated_at = $3
			WHERE account_id IN (SELECT account_id FROM l) AND balance - reserved >= $2::numeric
			RETURNING 1),
		r AS (
			INSERT INTO balance_reservation (operation_id, account_id, amount, status, created_at, updated_at)
			SELECT $4, $1, $2::numeric, 'active', $3, $3 WHERE EXISTS (SELECT 1 FROM u)
			RETURNING 1)
		SELECT EXISTS (SELECT 1 FROM l), EXISTS (SELECT 1 FROM r)`, account, amount, now, op).Scan(&locked, &reserved)
	if err != nil {
		return false, fmt.Errorf("payments: reserve: %w", err)
	}
	s.m.reservations.Inc()
	if locked {
		return reserved, nil
	}
	s.m.contended.Inc()
	start := time.Now()
	tag, err := tx.Exec(ctx, `
		UPDATE account SET reserved = reserved + $2::numeric, updated_at = $3
		WHERE account_id = $1 AND balance - reserved >= $2::numeric`, account, amount, now)
	s.m.lockWait.Observe(time.Since(start).Seconds())
	if err != nil {
		return false, fmt.Errorf("payments: reserve: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return false, nil
	}
	if _, err := tx.Exec(ctx, `
		INSERT INTO balance_reservation (operation_id, account_id, amount, status, created_at, updated_at)
		VALUES ($1, $2, $3::numeric, 'active', $4, $4)`, op, account, amount, now); err != nil {
		return false, fmt.Errorf("payments: insert reservation: %w", err)
	}
	return true, nil
}

// eventPayload is the JSON of payment.* events. Its fields are declared in
// internal/pii/schema.go; the customer travels sealed for the event
// (pii.SealPayload), never in clear.
type eventPayload struct {
	OperationID string            `json:"operation_id"`
	MerchantID  string            `json:"merchant_id"`
	InvoiceID   string            `json:"invoice_id"`
	Attempt     int               `json:"attempt"`
	AccountID   int64             `json:"account_id"`
	Amount      string            `json:"amount"`
	Currency    string            `json:"currency"`
	Status      Status            `json:"status"`
	ProviderRef string            `json:"provider_ref,omitempty"`
	FailureCode string            `json:"failure_code,omitempty"`
	ResolvedBy  string            `json:"resolved_by,omitempty"`
	Customer    map[string]string `json:"customer,omitempty"`
	OccurredAt  time.Time         `json:"occurred_at"`
}

// insertEvent writes a payment.* event. customer (in clear) is carried only
// by payment.requested.v1; it is sealed for this event's id, so kr may be
// nil when customer is.
func insertEvent(ctx context.Context, tx pgx.Tx, kr *pii.Keyring, topic, eventType string, p Payment, now time.Time, customer *Customer) error {
	w, err := eventWrite(ctx, kr, topic, eventType, p, now, customer)
	if err != nil {
		return err
	}
	if _, err := w.Insert(ctx, tx); err != nil {
		return fmt.Errorf("payments: write %s: %w", eventType, err)
	}
	return nil
}

// eventWrite makes the payment.* event of p at now, its customer sealed.
func eventWrite(ctx context.Context, kr *pii.Keyring, topic, eventType string, p Payment, now time.Time, customer *Customer) (outbox.Write, error) {
	ev := eventPayload{OperationID: p.OperationID.String(), MerchantID: p.MerchantID, InvoiceID: p.InvoiceID, Attempt: p.Attempt, AccountID: p.AccountID,
		Amount: p.Amount.StringFixed(2), Currency: p.Currency, Status: p.Status, ProviderRef: p.ProviderRef, FailureCode: p.FailureCode,
		ResolvedBy: p.ResolvedBy, OccurredAt: now}
	if customer != nil {
		ev.Customer = map[string]string{}
		for field, v := range map[string]string{pii.FieldName: customer.Name, pii.FieldEmail: customer.Email, pii.FieldTaxID: customer.TaxID} {
			if v != "" {
				ev.Customer[field] = v
			}
		}
	}
	payload, err := json.Marshal(ev)
	if err != nil {
		return outbox.Write{}, fmt.Errorf("payments: encode %s: %w", eventType, err)
	}
	// The id is made here, not by outbox.Prepare: the sealed fields are bound to it.
	id, err := uuid.NewV7()
	if err != nil {
		return outbox.Write{}, fmt.Errorf("payments: event id: %w", err)
	}
	if payload, err = pii.SealPayload(kr, eventType, id.String(), payload); err != nil {
		return outbox.Write{}, fmt.Errorf("payments: seal %s: %w", eventType, err)
	}
	w, err := outbox.Prepare(ctx, outbox.Event{ID: id, AggregateType: AggregateType, AggregateID: p.OperationID.String(), Topic: topic, EventType: eventType, Payload: payload})
	if err != nil {
		return outbox.Write{}, fmt.Errorf("payments: write %s: %w", eventType, err)
	}
	return w, nil
}
