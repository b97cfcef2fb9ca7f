package pii

// The field schema: which fields of each event type and table are personal
// data, and how a screen shows each one (the seed's x-gdpr-sensitive). It
// is default-deny twice over: a field not listed here is sealed on write
// like free text and redacted on display, and an event type not listed here
// cannot be sealed (SealPayload refuses it) and displays as redacted keys.
// Declaring a field Safe is a decision that it identifies no one.
//
// Event fields are paths of JSON object keys joined by "." ("customer.email");
// a declared path covers its whole value, objects and arrays included.

// Rule is how a field is protected and shown.
type Rule uint8

// Rules. Every rule but Safe seals the value on write.
const (
	undeclared Rule = iota // the zero value: sealed, and redacted on display
	Safe                   // shown in clear, stored in clear
	Name                   // "Ayşe Yılmaz" → "A*** Y***"
	Email                  // "ayse@example.com" → "a***@e***.com"
	TaxID                  // last two characters: "*******01"
	Phone                  // last two digits: "*******67"
	Address                // "[redacted]"
	FreeText               // "[redacted]"
)

// Schema maps a field (a table column, or a payload path) to its rule.
type Schema map[string]Rule

// paymentEvent is the payload of payment.* events (internal/payments).
// resolved_by is the operator's subject: it is shown wherever the console
// shows who resolved a payment, for accountability.
var paymentEvent = Schema{
	"operation_id": Safe, "merchant_id": Safe, "invoice_id": Safe, "attempt": Safe,
	"account_id": Safe, "amount": Safe, "currency": Safe, "status": Safe,
	"provider_ref": Safe, "failure_code": Safe, "resolved_by": Safe, "occurred_at": Safe,
	"customer.name": Name, "customer.email": Email, "customer.tax_id": TaxID,
}

// orderEvent is the payload of order.* events (the demo's business and
// the reference consumer's input).
var orderEvent = Schema{
	"order_id": Safe, "status": Safe, "amount": Safe, "currency": Safe, "malformed": Safe,
	"customer.name": Name, "customer.email": Email, "customer.phone": Phone,
	"shipping_address": Address, "note": FreeText,
}

var eventSchemas = map[string]Schema{
	"payment.requested.v1": paymentEvent,
	"payment.completed.v1": paymentEvent,
	"payment.failed.v1":    paymentEvent,
	"payment.unknown.v1":   paymentEvent,
	"order.placed.v1":      orderEvent,
	"order.paid.v1":        orderEvent,
	"order.shipped.v1":     orderEvent,
	"order.delivered.v1":   orderEvent,
}

var tableSchemas = map[string]Schema{
	// payment: the columns a screen shows; name, email and tax_id are the
	// keys of the encrypted customer column.
	"payment": {
		"operation_id": Safe, "merchant_id": Safe, "invoice_id": Safe, "account_id": Safe,
		"payment_type": Safe, "attempt": Safe, "amount": Safe, "currency": Safe, "status": Safe,
		"provider_ref": Safe, "failure_code": Safe, "created_at": Safe, "updated_at": Safe,
		"unknown_since": Safe, "resolved_at": Safe, "resolved_by": Safe, "inquiry_attempts": Safe,
		FieldName: Name, FieldEmail: Email, FieldTaxID: TaxID,
	},
}

// EventSchema is the schema of an event type, if it has one.
func EventSchema(eventType string) (Schema, bool) {
	s, ok := eventSchemas[eventType]
	return s, ok
}

// TableSchema is the schema of a table, if it has one.
func TableSchema(table string) (Schema, bool) {
	s, ok := tableSchemas[table]
	return s, ok
}
