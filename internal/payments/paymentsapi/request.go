package paymentsapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/payments"
)

// RequestError is a client mistake in the request: HTTP status, stable code,
// message (never echoing sensitive input).
type RequestError struct {
	Status  int
	Code    string
	Message string
}

func (e *RequestError) Error() string { return e.Code + ": " + e.Message }

func badRequest(code, format string, args ...any) *RequestError {
	return &RequestError{Status: 400, Code: code, Message: fmt.Sprintf(format, args...)}
}

func unprocessable(code, format string, args ...any) *RequestError {
	return &RequestError{Status: 422, Code: code, Message: fmt.Sprintf(format, args...)}
}

var invoicePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,63}$`)

type wireRequest struct {
	InvoiceID json.RawMessage `json:"invoice_id"`
	AccountID json.RawMessage `json:"account_id"`
	Amount    json.RawMessage `json:"amount"`
	Currency  *string         `json:"currency"`
	Customer  *struct {
		Name  *string `json:"name"`
		Email *string `json:"email"`
		TaxID *string `json:"tax_id"`
	} `json:"customer"`
}

// ParseRequest decodes and validates a request body. Field order,
// whitespace and number format do not matter ("1000", "1000.00", 1e3 are
// one amount); unknown fields, more than two decimals, non-positive or
// absurd amounts, unsupported currencies and missing fields are refused.
func ParseRequest(body []byte) (payments.Request, error) {
	// JSON is UTF-8 (RFC 8259). encoding/json would quietly replace
	// invalid bytes with U+FFFD, and the payment would then keep, seal
	// and send on a name the client never wrote.
	if !utf8.Valid(body) {
		return payments.Request{}, badRequest("malformed_json", "the body is not valid UTF-8")
	}
	if err := exactFields(body); err != nil {
		return payments.Request{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	var w wireRequest
	if err := dec.Decode(&w); err != nil {
		var se *json.SyntaxError
		var ute *json.UnmarshalTypeError
		switch {
		case errors.As(err, &ute):
			return payments.Request{}, badRequest("invalid_field", "field %q has the wrong type", ute.Field)
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			// encoding/json has no typed error for unknown fields.
			return payments.Request{}, badRequest("unknown_field", "the body has a field this API does not know")
		case errors.As(err, &se), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return payments.Request{}, badRequest("malformed_json", "the body is not valid JSON")
		default:
			return payments.Request{}, badRequest("malformed_json", "the body is not valid JSON")
		}
	}
	if dec.More() {
		return payments.Request{}, badRequest("malformed_json", "the body has data after the JSON object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return payments.Request{}, badRequest("malformed_json", "the body has data after the JSON object")
	}
	var r payments.Request
	var err error
	if r.InvoiceID, err = scalarString("invoice_id", w.InvoiceID); err != nil {
		return payments.Request{}, err
	}
	if !invoicePattern.MatchString(r.InvoiceID) {
		return payments.Request{}, unprocessable("invalid_invoice_id", "invoice_id must be 1–64 letters, digits or . _ : / -")
	}
	acc, err := scalarString("account_id", w.AccountID)
	if err != nil {
		return payments.Request{}, err
	}
	if r.AccountID, err = strconv.ParseInt(acc, 10, 64); err != nil || r.AccountID <= 0 {
		return payments.Request{}, unprocessable("invalid_account_id", "account_id must be a positive whole number")
	}
	amt, err := scalarString("amount", w.Amount)
	if err != nil {
		return payments.Request{}, err
	}
	if r.Amount, err = ParseAmount(amt); err != nil {
		return payments.Request{}, err
	}
	if w.Currency == nil || strings.TrimSpace(*w.Currency) == "" {
		return payments.Request{}, unprocessable("missing_field", "currency is required")
	}
	// ASCII letters only, then upper case: strings.ToUpper maps some other
	// letters onto ASCII ("uſd", with a long s, would read as USD).
	r.Currency = strings.TrimSpace(*w.Currency)
	if strings.ContainsFunc(r.Currency, func(c rune) bool { return (c < 'A' || c > 'Z') && (c < 'a' || c > 'z') }) {
		return payments.Request{}, unprocessable("unsupported_currency", "currency must be one of TRY, USD, EUR, GBP")
	}
	r.Currency = strings.ToUpper(r.Currency)
	if !payments.SupportedCurrency(r.Currency) {
		return payments.Request{}, unprocessable("unsupported_currency", "currency must be one of TRY, USD, EUR, GBP")
	}
	if w.Customer == nil {
		return payments.Request{}, unprocessable("missing_field", "customer is required")
	}
	if w.Customer.Name == nil || strings.TrimSpace(*w.Customer.Name) == "" {
		return payments.Request{}, unprocessable("missing_field", "customer.name is required")
	}
	if w.Customer.Email == nil || strings.TrimSpace(*w.Customer.Email) == "" {
		return payments.Request{}, unprocessable("missing_field", "customer.email is required")
	}
	// Control characters are refused before the name's spaces are
	// folded: folded first, a tab or a line break became a space, and the
	// payment kept a name other than the one sent.
	if strings.ContainsFunc(*w.Customer.Name, unicode.IsControl) {
		return payments.Request{}, unprocessable("invalid_customer", "customer.name has a control character")
	}
	r.Customer.Name = strings.Join(strings.Fields(*w.Customer.Name), " ")
	r.Customer.Email = strings.ToLower(strings.TrimSpace(*w.Customer.Email))
	if w.Customer.TaxID != nil {
		r.Customer.TaxID = strings.TrimSpace(*w.Customer.TaxID)
	}
	if utf8.RuneCountInString(r.Customer.Name) > 200 {
		return payments.Request{}, unprocessable("invalid_customer", "customer.name must be at most 200 characters")
	}
	if len(r.Customer.Email) > 254 || strings.Count(r.Customer.Email, "@") != 1 || strings.HasPrefix(r.Customer.Email, "@") || strings.HasSuffix(r.Customer.Email, "@") || strings.ContainsAny(r.Customer.Email, " \t\r\n") {
		return payments.Request{}, unprocessable("invalid_customer", "customer.email is not an email address")
	}
	if len(r.Customer.TaxID) > 32 {
		return payments.Request{}, unprocessable("invalid_customer", "customer.tax_id must be at most 32 characters")
	}
	// Control characters (NUL, escapes, line breaks) are in no one's name,
	// address or tax number; kept, they would reach the provider, the
	// console and the exports.
	for field, v := range map[string]string{"name": r.Customer.Name, "email": r.Customer.Email, "tax_id": r.Customer.TaxID} {
		if strings.ContainsFunc(v, unicode.IsControl) {
			return payments.Request{}, unprocessable("invalid_customer", "customer.%s has a control character", field)
		}
	}
	return r, nil
}

// scalarString accepts a JSON string or number and returns its text.
func scalarString(field string, raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", unprocessable("missing_field", "%s is required", field)
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", badRequest("malformed_json", "the body is not valid JSON")
		}
		s = strings.TrimSpace(s)
		if s == "" {
			return "", unprocessable("missing_field", "%s is required", field)
		}
		return s, nil
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return string(raw), nil
	}
	return "", badRequest("invalid_field", "field %q must be a string or a number", field)
}

// ParseAmount reads a positive amount with at most two decimals, up to
// payments.MaxAmount.
func ParseAmount(s string) (decimal.Decimal, error) {
	if len(s) > 40 {
		return decimal.Decimal{}, unprocessable("invalid_amount", "amount must be at most 40 characters")
	}
	d, err := decimal.NewFromString(s)
	if err != nil {
		return decimal.Decimal{}, unprocessable("invalid_amount", "amount is not a decimal number")
	}
	if !d.IsPositive() {
		return decimal.Decimal{}, unprocessable("invalid_amount", "amount must be greater than zero")
	}
	if limit := payments.MaxAmount(); d.GreaterThan(limit) {
		return decimal.Decimal{}, unprocessable("amount_out_of_range", "amount must be at most %s", limit.String())
	}
	if !d.Equal(d.Round(2)) {
		return decimal.Decimal{}, unprocessable("amount_precision", "amount has more than two decimals")
	}
	return d.Round(2), nil
}

// requestFields are the names a request's objects may hold, exactly as
// written: the body's own, and the customer's.
var requestFields = map[string]map[string]bool{
	"":         {"invoice_id": true, "account_id": true, "amount": true, "currency": true, "customer": true},
	"customer": {"name": true, "email": true, "tax_id": true},
}

// exactFields refuses a body whose object, or its customer, repeats a name
// or spells one otherwise than this API does, escapes included.
// encoding/json matches names without regard to case and keeps the last of
// a repeated one, so {"amount":"10.00","AMOUNT":"9999.00"} decoded to
// 9999.00: a gateway, a log or a fraud check reading the first "amount"
// saw another payment than the one charged ("\u0061mount" likewise hides
// the name from a reader of the raw bytes). Anything else (not JSON, not
// an object, trailing data, a wrong type) is left to the decoder after it.
func exactFields(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	type frame struct {
		object  bool
		fields  map[string]bool // the names it may hold; nil: not checked
		seen    map[string]bool
		wantKey bool // the next token of an object is a name
	}
	var stack []frame
	key := ""
	for {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return nil // not JSON, or the end: the decoder after this says so
		}
		if name, isName := tok.(string); isName && len(stack) > 0 && stack[len(stack)-1].object && stack[len(stack)-1].wantKey {
			f := &stack[len(stack)-1]
			f.wantKey, key = false, name
			if f.fields == nil {
				continue
			}
			if bytes.IndexByte(body[start:dec.InputOffset()], '\\') >= 0 {
				return badRequest("unknown_field", "the body has a field name written with escapes; write names as this API does")
			}
			if f.seen[name] {
				return badRequest("duplicate_field", "the body has field %q twice", name)
			}
			f.seen[name] = true
			if !f.fields[name] {
				return badRequest("unknown_field", "the body has a field this API does not know (names are matched exactly, case included)")
			}
			continue
		}
		switch tok {
		case json.Delim('{'):
			f := frame{object: true, wantKey: true}
			switch {
			case len(stack) == 0:
				f.fields = requestFields[""]
			case len(stack) == 1 && stack[0].fields != nil && key == "customer":
				f.fields = requestFields["customer"]
			}
			if f.fields != nil {
				f.seen = map[string]bool{}
			}
			stack = append(stack, f)
			continue
		case json.Delim('['):
			stack = append(stack, frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if len(stack) == 0 {
			return nil // the body's value is whole; what follows is the decoder's
		}
		// A value ended (or an object or array that was one): the
		// enclosing object's next token is a name.
		if stack[len(stack)-1].object {
			stack[len(stack)-1].wantKey = true
		}
	}
}
