// Package paymentstest holds fixture factories for tests of every room that
// need payments, accounts, merchants or idempotency keys in a test
// database, so no test outside internal/payments writes those tables by
// hand. Each factory takes an option struct whose zero values are
// sensible, and fails the test on error. It is imported by tests only.
package paymentstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/pii"
)

// Keyring is a fresh PII keyring (key id "t1").
func Keyring(t testing.TB) *pii.Keyring {
	t.Helper()
	keys, blind, err := pii.GenerateSpec("t1")
	if err != nil {
		t.Fatal(err)
	}
	kr, err := pii.ParseKeyring(keys, blind)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// MerchantOpts describe a merchant.
type MerchantOpts struct {
	ID   string // default "m-test"
	Name string // default "test <ID>"
}

// Merchant creates the merchant (kept when it exists) and a new API key
// for it, and returns the key.
func Merchant(t testing.TB, pool *pgxpool.Pool, o MerchantOpts) string {
	t.Helper()
	if o.ID == "" {
		o.ID = "m-test"
	}
	if o.Name == "" {
		o.Name = "test " + o.ID
	}
	ctx := context.Background()
	if err := payments.CreateMerchant(ctx, pool, o.ID, o.Name); err != nil && !errors.Is(err, payments.ErrMerchantExists) {
		t.Fatalf("paymentstest: merchant %s: %v", o.ID, err)
	}
	key, _, err := payments.CreateKey(ctx, pool, o.ID)
	if err != nil {
		t.Fatalf("paymentstest: key of %s: %v", o.ID, err)
	}
	return key
}

// AccountOpts describe an account.
type AccountOpts struct {
	ID       int64  // required
	Merchant string // its owner, an existing merchant (Merchant); "" for none
	Currency string // default TRY
	Balance  string // opening balance, written as a ledger credit (default 0)
}

// Account opens an account through payments.CreateAccount and returns its id.
func Account(t testing.TB, pool *pgxpool.Pool, o AccountOpts) int64 {
	t.Helper()
	if o.ID == 0 {
		t.Fatal("paymentstest: AccountOpts.ID is required")
	}
	if o.Currency == "" {
		o.Currency = "TRY"
	}
	if o.Balance == "" {
		o.Balance = "0"
	}
	opening, err := decimal.NewFromString(o.Balance)
	if err != nil {
		t.Fatalf("paymentstest: balance %q: %v", o.Balance, err)
	}
	if err := payments.CreateAccount(context.Background(), pool, o.Merchant, o.ID, o.Currency, opening); err != nil {
		t.Fatalf("paymentstest: account %d: %v", o.ID, err)
	}
	return o.ID
}

// PaymentOpts describe a payment.
type PaymentOpts struct {
	Account  int64             // required: an existing account (Account)
	Merchant string            // default "m"
	Invoice  string            // default a unique one
	Amount   string            // default "10.00"
	Status   payments.Status   // default unknown
	Age      time.Duration     // how long ago it was made (and went unknown), on the database clock
	Customer map[string]string // stored as it is (normally pii envelopes, sealed for OperationID); default none
	// OperationID is the payment's id (default a new UUIDv7): known before
	// the call, so customer envelopes can be sealed for it.
	OperationID uuid.UUID
	// EmailIndex and TaxIDIndex are the customer's blind indexes, stored as
	// they are (kr.BlindIndex of the clear values, as the service writes).
	EmailIndex, TaxIDIndex []byte
}

// Payment writes a payment with the books a real one in its status has: a
// processing or unknown payment holds an active reservation on its account,
// a completed one is debited (finalized reservation, ledger debit), a
// failed one's reservation is released. It returns the operation id.
func Payment(t testing.TB, pool *pgxpool.Pool, o PaymentOpts) uuid.UUID {
	t.Helper()
	if o.Account == 0 {
		t.Fatal("paymentstest: PaymentOpts.Account is required")
	}
	if o.Merchant == "" {
		o.Merchant = "m"
	}
	if o.Invoice == "" {
		o.Invoice = "inv-" + randomHex(t, 6)
	}
	if o.Amount == "" {
		o.Amount = "10.00"
	}
	if o.Status == "" {
		o.Status = payments.StatusUnknown
	}
	if o.Customer == nil {
		o.Customer = map[string]string{}
	}
	customer, err := json.Marshal(o.Customer)
	if err != nil {
		t.Fatal(err)
	}
	op := o.OperationID
	if op == uuid.Nil {
		if op, err = uuid.NewV7(); err != nil {
			t.Fatal(err)
		}
	}
	reservation := map[payments.Status]string{
		payments.StatusProcessing: payments.ReservationActive,
		payments.StatusUnknown:    payments.ReservationActive,
		payments.StatusCompleted:  payments.ReservationFinalized,
		payments.StatusFailed:     payments.ReservationReleased,
	}[o.Status]
	if reservation == "" {
		t.Fatalf("paymentstest: no payment status %q", o.Status)
	}
	args := pgx.NamedArgs{"op": op, "merchant": o.Merchant, "invoice": o.Invoice, "type": payments.PaymentTypeCharge,
		"account": o.Account, "amount": o.Amount, "status": string(o.Status), "customer": customer,
		"age": o.Age.Microseconds(), "reservation": reservation, "email_bidx": o.EmailIndex, "tax_bidx": o.TaxIDIndex}
	err = db.WithTx(context.Background(), pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(context.Background(), `
			INSERT INTO payment (operation_id, merchant_id, invoice_id, payment_type, account_id, amount, currency, customer, status,
			                     unknown_since, created_at, updated_at, customer_email_bidx, customer_tax_id_bidx)
			SELECT @op, @merchant, @invoice, @type, @account, @amount::numeric, a.currency, @customer, @status,
			       CASE WHEN @status = 'unknown' THEN t.at END, t.at, t.at, @email_bidx::bytea, @tax_bidx::bytea
			FROM account a, (SELECT now() - @age::bigint * interval '1 microsecond' AS at) t
			WHERE a.account_id = @account`, args); err != nil {
			return fmt.Errorf("payment: %w", err)
		}
		if _, err := tx.Exec(context.Background(), `
			INSERT INTO balance_reservation (operation_id, account_id, amount, status) VALUES (@op, @account, @amount::numeric, @reservation)`, args); err != nil {
			return fmt.Errorf("reservation: %w", err)
		}
		switch o.Status {
		case payments.StatusProcessing, payments.StatusUnknown:
			_, err = tx.Exec(context.Background(), `UPDATE account SET reserved = reserved + @amount::numeric WHERE account_id = @account`, args)
		case payments.StatusCompleted:
			if _, err = tx.Exec(context.Background(), `UPDATE account SET balance = balance - @amount::numeric WHERE account_id = @account`, args); err == nil {
				_, err = tx.Exec(context.Background(), `
					INSERT INTO ledger_entry (operation_id, account_id, entry_type, amount, currency, memo)
					SELECT @op, @account, 'debit', @amount::numeric, currency, 'payment ' || @invoice FROM account WHERE account_id = @account`, args)
			}
		}
		return err
	})
	if err != nil {
		t.Fatalf("paymentstest: payment of account %d: %v", o.Account, err)
	}
	return op
}

// KeyOpts describe an idempotency key still processing.
type KeyOpts struct {
	Merchant  string        // default "m"
	Key       string        // default a unique one
	LeaseLeft time.Duration // until its lease ends, on the database clock; negative: expired (recovery's work)
}

// ProcessingKey writes an idempotency record still processing (its owner
// has not answered yet, or died when LeaseLeft is negative), without a
// payment, and returns its operation id.
func ProcessingKey(t testing.TB, pool *pgxpool.Pool, o KeyOpts) uuid.UUID {
	t.Helper()
	if o.Merchant == "" {
		o.Merchant = "m"
	}
	if o.Key == "" {
		o.Key = randomHex(t, 8)
	}
	op, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `
		INSERT INTO idempotency_record (merchant_id, idempotency_key, request_hash, status, operation_id, locked_until)
		VALUES (@merchant, @key, 'paymentstest', 'processing', @op, now() + @left::bigint * interval '1 microsecond')`,
		pgx.NamedArgs{"merchant": o.Merchant, "key": o.Key, "op": op, "left": o.LeaseLeft.Microseconds()}); err != nil {
		t.Fatalf("paymentstest: key %s: %v", o.Key, err)
	}
	return op
}

// CheckBooks fails the test unless the account's books add up
// (payments.CheckBooks).
func CheckBooks(t testing.TB, pool *pgxpool.Pool, account int64) {
	t.Helper()
	if err := payments.CheckBooks(context.Background(), pool, account); err != nil {
		t.Error(err)
	}
}

func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// AnswerOpts is an idempotency record whose request already has its stored
// answer (what a client retry with the same key gets).
type AnswerOpts struct {
	Merchant       string    // default "m"
	Key            string    // default a unique one
	OperationID    uuid.UUID // the payment the key made
	Status         payments.Status
	ResponseStatus int
	ResponseBody   string // JSON
}

// StoredAnswer writes a finished idempotency record.
func StoredAnswer(t testing.TB, pool *pgxpool.Pool, o AnswerOpts) {
	t.Helper()
	if o.Merchant == "" {
		o.Merchant = "m"
	}
	if o.Key == "" {
		o.Key = randomHex(t, 8)
	}
	if _, err := pool.Exec(context.Background(), `
		INSERT INTO idempotency_record (merchant_id, idempotency_key, request_hash, status, operation_id, response_status, response_body)
		VALUES (@merchant, @key, 'paymentstest', @status, @op, @code, @body::jsonb)`,
		pgx.NamedArgs{"merchant": o.Merchant, "key": o.Key, "status": string(o.Status), "op": o.OperationID,
			"code": o.ResponseStatus, "body": o.ResponseBody}); err != nil {
		t.Fatalf("paymentstest: stored answer of %s: %v", o.Key, err)
	}
}
