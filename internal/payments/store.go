package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/db"
)

// notFound turns pgx.ErrNoRows into ErrNotFound: the one place it happens.
func notFound(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	return err
}

const recordCols = `merchant_id, idempotency_key, request_hash, status, operation_id,
	coalesce(response_status, 0), coalesce(response_body::text, ''), locked_until, created_at, expires_at`

func scanRecord(row pgx.Row) (Record, error) {
	var r Record
	var body string
	var status string
	err := row.Scan(&r.MerchantID, &r.Key, &r.RequestHash, &status, &r.OperationID, &r.ResponseStatus, &body, &r.LockedUntil, &r.CreatedAt, &r.ExpiresAt)
	if err != nil {
		return Record{}, notFound(err)
	}
	r.Status = Status(status)
	if body != "" {
		r.ResponseBody = []byte(body)
	}
	return r, nil
}

// GetRecord reads the idempotency record of (merchant, key).
func GetRecord(ctx context.Context, q db.RowQuerier, merchantID, key string) (Record, error) {
	return scanRecord(q.QueryRow(ctx, `SELECT `+recordCols+` FROM idempotency_record WHERE merchant_id = $1 AND idempotency_key = $2`, merchantID, key))
}

// RecordByOperation reads the idempotency record of an operation.
func RecordByOperation(ctx context.Context, q db.RowQuerier, op uuid.UUID) (Record, error) {
	return scanRecord(q.QueryRow(ctx, `SELECT `+recordCols+` FROM idempotency_record WHERE operation_id = $1`, op))
}

const paymentCols = `operation_id, merchant_id, invoice_id, payment_type, account_id, amount::text, currency,
	customer, status, coalesce(provider_ref, ''), coalesce(failure_code, ''), unknown_since, next_inquiry_at,
	inquiry_attempts, resolved_at, coalesce(resolved_by, ''), created_at, updated_at, attempt,
	last_inquiry_at, coalesce(last_inquiry_answer, '')`

func scanPayment(row pgx.Row) (Payment, error) {
	var p Payment
	var amount, status string
	var customer []byte
	err := row.Scan(&p.OperationID, &p.MerchantID, &p.InvoiceID, &p.PaymentType, &p.AccountID, &amount, &p.Currency,
		&customer, &status, &p.ProviderRef, &p.FailureCode, &p.UnknownSince, &p.NextInquiryAt,
		&p.InquiryAttempts, &p.ResolvedAt, &p.ResolvedBy, &p.CreatedAt, &p.UpdatedAt, &p.Attempt,
		&p.LastInquiryAt, &p.LastInquiryAnswer)
	if err != nil {
		return Payment{}, notFound(err)
	}
	p.Status = Status(status)
	if p.Amount, err = decimal.NewFromString(amount); err != nil {
		return Payment{}, fmt.Errorf("payments: amount %q: %w", amount, err)
	}
	if len(customer) > 0 {
		if err := json.Unmarshal(customer, &p.Customer); err != nil {
			return Payment{}, fmt.Errorf("payments: customer column: %w", err)
		}
	}
	return p, nil
}

// Get reads one payment.
func Get(ctx context.Context, q db.RowQuerier, op uuid.UUID) (Payment, error) {
	return scanPayment(q.QueryRow(ctx, `SELECT `+paymentCols+` FROM payment WHERE operation_id = $1`, op))
}

// LiveAttempt reads the invoice's attempt that is not failed (processing,
// unknown or completed): the one that blocks a new attempt. ErrNotFound
// when every attempt failed or there is none.
func LiveAttempt(ctx context.Context, q db.RowQuerier, merchantID, invoiceID, paymentType string) (Payment, error) {
	return scanPayment(q.QueryRow(ctx, `SELECT `+paymentCols+` FROM payment
		WHERE merchant_id = $1 AND invoice_id = $2 AND payment_type = $3 AND status <> 'failed'`, merchantID, invoiceID, paymentType))
}

// getForUpdate reads one payment and locks it until tx ends.
func getForUpdate(ctx context.Context, tx pgx.Tx, op uuid.UUID) (Payment, error) {
	return scanPayment(tx.QueryRow(ctx, `SELECT `+paymentCols+` FROM payment WHERE operation_id = $1 FOR UPDATE`, op))
}

// ListUnknown returns unknown payments, oldest first (the partial index
// payment_unknown_idx keeps this O(unknown)).
func ListUnknown(ctx context.Context, q db.Querier, limit int) ([]Payment, error) {
	rows, err := q.Query(ctx, `SELECT `+paymentCols+` FROM payment WHERE status = 'unknown' ORDER BY unknown_since, operation_id LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("payments: list unknown: %w", err)
	}
	return collectPayments(rows, "list unknown")
}

// ReservationOf reads an operation's reservation.
func ReservationOf(ctx context.Context, q db.RowQuerier, op uuid.UUID) (Reservation, error) {
	var r Reservation
	var amount string
	err := q.QueryRow(ctx, `SELECT operation_id, account_id, amount::text, status FROM balance_reservation WHERE operation_id = $1`, op).
		Scan(&r.OperationID, &r.AccountID, &amount, &r.Status)
	if err != nil {
		return Reservation{}, notFound(err)
	}
	if r.Amount, err = decimal.NewFromString(amount); err != nil {
		return Reservation{}, fmt.Errorf("payments: reservation of %s amount %q: %w", op, amount, err)
	}
	return r, nil
}

// LedgerOf lists an operation's ledger entries in order.
func LedgerOf(ctx context.Context, q db.Querier, op uuid.UUID) ([]LedgerEntry, error) {
	rows, err := q.Query(ctx, `SELECT entry_id, operation_id, account_id, entry_type, amount::text, currency, coalesce(memo, ''), created_at
		FROM ledger_entry WHERE operation_id = $1 ORDER BY entry_id`, op)
	if err != nil {
		return nil, fmt.Errorf("payments: ledger of %s: %w", op, err)
	}
	defer rows.Close()
	var out []LedgerEntry
	for rows.Next() {
		var e LedgerEntry
		var amount string
		if err := rows.Scan(&e.EntryID, &e.OperationID, &e.AccountID, &e.EntryType, &amount, &e.Currency, &e.Memo, &e.CreatedAt); err != nil {
			return nil, fmt.Errorf("payments: ledger of %s: %w", op, err)
		}
		if e.Amount, err = decimal.NewFromString(amount); err != nil {
			return nil, fmt.Errorf("payments: ledger of %s: amount %q: %w", op, amount, err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("payments: ledger of %s: %w", op, err)
	}
	return out, nil
}

// Account is one account row.
type Account struct {
	AccountID int64
	Currency  string
	Balance   decimal.Decimal
	Reserved  decimal.Decimal
}

// Available is what can still be reserved.
func (a Account) Available() decimal.Decimal { return a.Balance.Sub(a.Reserved) }

// GetAccount reads an account.
func GetAccount(ctx context.Context, q db.RowQuerier, id int64) (Account, error) {
	var a Account
	var bal, res string
	err := q.QueryRow(ctx, `SELECT account_id, currency, balance::text, reserved::text FROM account WHERE account_id = $1`, id).Scan(&a.AccountID, &a.Currency, &bal, &res)
	if err != nil {
		return Account{}, notFound(err)
	}
	if a.Balance, err = decimal.NewFromString(bal); err != nil {
		return Account{}, fmt.Errorf("payments: account %d balance %q: %w", id, bal, err)
	}
	if a.Reserved, err = decimal.NewFromString(res); err != nil {
		return Account{}, fmt.Errorf("payments: account %d reserved %q: %w", id, res, err)
	}
	return a, nil
}

// CreateAccount opens an account owned by merchantID (empty: no owner yet,
// so no payment can debit it) with an opening balance, written as a ledger
// credit so the balance can be recomputed from the ledger. An existing
// account is left as it is (ErrAccountExists).
func CreateAccount(ctx context.Context, b db.Beginner, merchantID string, id int64, currency string, opening decimal.Decimal) error {
	if !SupportedCurrency(currency) {
		return fmt.Errorf("payments: currency %q is not supported", currency)
	}
	if opening.IsNegative() {
		return errors.New("payments: opening balance must not be negative")
	}
	return db.WithTx(ctx, b, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO account (account_id, currency, balance, merchant_id) VALUES ($1, $2, 0, nullif($3, '')) ON CONFLICT DO NOTHING`, id, currency, merchantID)
		if db.Code(err) == db.CodeForeignKeyViolation {
			return fmt.Errorf("payments: no merchant %q: %w", merchantID, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("payments: create account %d: %w", id, err)
		}
		if tag.RowsAffected() == 0 {
			return ErrAccountExists
		}
		if opening.IsPositive() {
			return credit(ctx, tx, id, currency, opening, "opening balance")
		}
		return nil
	})
}

// ErrAccountExists is returned by CreateAccount for an existing account.
var ErrAccountExists = errors.New("payments: account exists")

// Credit adds money to an account (a top-up), with its ledger entry.
func Credit(ctx context.Context, b db.Beginner, id int64, amount decimal.Decimal, memo string) error {
	if !amount.IsPositive() {
		return errors.New("payments: credit must be positive")
	}
	return db.WithTx(ctx, b, func(tx pgx.Tx) error {
		var currency string
		if err := tx.QueryRow(ctx, `SELECT currency FROM account WHERE account_id = $1`, id).Scan(&currency); err != nil {
			return fmt.Errorf("payments: credit account %d: %w", id, notFound(err))
		}
		return credit(ctx, tx, id, currency, amount, memo)
	})
}

func credit(ctx context.Context, tx pgx.Tx, id int64, currency string, amount decimal.Decimal, memo string) error {
	op, err := uuid.NewV7()
	if err != nil {
		return fmt.Errorf("payments: credit account %d: %w", id, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE account SET balance = balance + $2::numeric, updated_at = now() WHERE account_id = $1`, id, amount.StringFixed(2)); err != nil {
		return fmt.Errorf("payments: credit account %d: %w", id, err)
	}
	if _, err = tx.Exec(ctx, `INSERT INTO ledger_entry (operation_id, account_id, entry_type, amount, currency, memo) VALUES ($1, $2, 'credit', $3::numeric, $4, $5)`,
		op, id, amount.StringFixed(2), currency, memo); err != nil {
		return fmt.Errorf("payments: ledger credit of account %d: %w", id, err)
	}
	return nil
}

// ListFilter selects a page of payments for the console: by status (empty:
// all), newest first, after a keyset cursor (the last row of the previous
// page), so a page costs O(limit) on payment_status_created_idx.
type ListFilter struct {
	Status    Status
	Limit     int
	AfterTime time.Time // cursor: created_at of the previous page's last row
	AfterOpID uuid.UUID // cursor: its operation_id
	HasCursor bool
}

// List returns one page of payments.
func List(ctx context.Context, q db.Querier, f ListFilter) ([]Payment, error) {
	if f.Limit <= 0 || f.Limit > 500 {
		f.Limit = 50
	}
	rows, err := q.Query(ctx, `SELECT `+paymentCols+` FROM payment
		WHERE ($1 = '' OR status = $1)
		  AND (NOT $2 OR (created_at, operation_id) < ($3, $4))
		ORDER BY created_at DESC, operation_id DESC
		LIMIT $5`, string(f.Status), f.HasCursor, f.AfterTime, f.AfterOpID, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("payments: list payments: %w", err)
	}
	return collectPayments(rows, "list payments")
}

// collectPayments scans every row of a payment query; what names it in errors.
func collectPayments(rows pgx.Rows, what string) ([]Payment, error) {
	defer rows.Close()
	var out []Payment
	for rows.Next() {
		p, err := scanPayment(rows)
		if err != nil {
			return nil, fmt.Errorf("payments: %s: %w", what, err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("payments: %s: %w", what, err)
	}
	return out, nil
}

// ErrBooksDisagree is returned by CheckBooks for an account whose books do
// not add up.
var ErrBooksDisagree = errors.New("payments: books do not add up")

// CheckBooks verifies an account's books: reserved equals its active
// reservations, the balance equals the ledger's credits minus debits, and
// neither the balance nor what is available is negative.
func CheckBooks(ctx context.Context, q db.RowQuerier, id int64) error {
	a, err := GetAccount(ctx, q, id)
	if err != nil {
		return fmt.Errorf("payments: check books of %d: %w", id, err)
	}
	var active, ledger string
	if err := q.QueryRow(ctx, `
		SELECT (SELECT coalesce(sum(amount), 0)::text FROM balance_reservation WHERE account_id = $1 AND status = 'active'),
		       (SELECT coalesce(sum(CASE WHEN entry_type = 'credit' THEN amount ELSE -amount END), 0)::text FROM ledger_entry WHERE account_id = $1)`,
		id).Scan(&active, &ledger); err != nil {
		return fmt.Errorf("payments: check books of %d: %w", id, err)
	}
	activeSum, err := decimal.NewFromString(active)
	if err != nil {
		return fmt.Errorf("payments: check books of %d: reservations %q: %w", id, active, err)
	}
	ledgerSum, err := decimal.NewFromString(ledger)
	if err != nil {
		return fmt.Errorf("payments: check books of %d: ledger %q: %w", id, ledger, err)
	}
	var problems []error
	if !a.Reserved.Equal(activeSum) {
		problems = append(problems, fmt.Errorf("reserved %s but active reservations sum to %s", a.Reserved, active))
	}
	if !a.Balance.Equal(ledgerSum) {
		problems = append(problems, fmt.Errorf("balance %s but the ledger says %s", a.Balance, ledger))
	}
	if a.Balance.IsNegative() || a.Available().IsNegative() {
		problems = append(problems, fmt.Errorf("balance %s reserved %s", a.Balance, a.Reserved))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: account %d: %w", ErrBooksDisagree, id, errors.Join(problems...))
	}
	return nil
}
