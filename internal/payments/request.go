package payments

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"

	"github.com/shopspring/decimal"
)

// Request is a validated, normalised payment request (the transport parses
// and validates it; see paymentsapi.ParseRequest).
type Request struct {
	InvoiceID string
	AccountID int64
	Amount    decimal.Decimal
	Currency  string
	Customer  Customer
}

// Customer is the personal data of a request, in clear (it is encrypted
// before anything is stored).
type Customer struct {
	Name  string
	Email string
	TaxID string
}

// SupportedCurrency reports whether the service accepts a currency (ISO
// 4217, two minor units each): TRY, USD, EUR, GBP.
func SupportedCurrency(code string) bool {
	switch code {
	case "TRY", "USD", "EUR", "GBP":
		return true
	}
	return false
}

// maxAmountUnits is the largest amount one payment may carry, in whole
// units: anything above is absurd for this service.
const maxAmountUnits = 1_000_000_000

// MaxAmount is the largest amount one payment may carry; a transport refuses
// anything above before it reaches the database.
func MaxAmount() decimal.Decimal { return decimal.New(maxAmountUnits, 0) }

// Canonical is the request's deterministic representation: keys sorted,
// amounts with exactly two decimals, no whitespace.
func (r Request) Canonical() []byte {
	// A map marshals with sorted keys; every value is a string, so the bytes
	// depend only on the request's meaning.
	m := map[string]any{
		"account_id": strconv.FormatInt(r.AccountID, 10),
		"amount":     r.Amount.StringFixed(2),
		"currency":   r.Currency,
		"invoice_id": r.InvoiceID,
		"customer": map[string]string{
			"email":  r.Customer.Email,
			"name":   r.Customer.Name,
			"tax_id": r.Customer.TaxID,
		},
	}
	b, _ := json.Marshal(m)
	return b
}

// Hash is the hex SHA-256 of the canonical form. With a key (the
// blind-index key) it is an HMAC, so the stored hash cannot be matched
// against guessed personal data.
func (r Request) Hash(mac func([]byte) []byte) string {
	c := r.Canonical()
	if mac != nil {
		return hex.EncodeToString(mac(c))
	}
	sum := sha256.Sum256(c)
	return hex.EncodeToString(sum[:])
}
