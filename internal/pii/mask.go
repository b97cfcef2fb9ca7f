package pii

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Sensitive field names the project knows how to mask.
const (
	FieldName  = "name"
	FieldEmail = "email"
	FieldTaxID = "tax_id"
)

// Masked is what a field shows when nothing of it may be shown.
const Masked = "***"

// safeFields are the only fields shown in clear (default-deny): anything not
// listed here is masked, so a new field leaks nothing until someone declares
// it safe on purpose.
var safeFields = map[string]bool{
	"operation_id": true, "merchant_id": true, "invoice_id": true, "account_id": true,
	"payment_type": true, "amount": true, "currency": true, "status": true,
	"provider_ref": true, "failure_code": true, "created_at": true, "updated_at": true,
	"unknown_since": true, "resolved_at": true, "inquiry_attempts": true,
}

// Safe reports whether field may be shown in clear.
func Safe(field string) bool { return safeFields[field] }

// Show is the field policy in one call: safe fields in clear, everything
// else masked.
func Show(field, value string) string {
	if Safe(field) {
		return value
	}
	return Mask(field, value)
}

// Mask hides a sensitive value, keeping only hints an operator needs to tell
// values apart: "Ayşe Yılmaz" → "A*** Y***", "ayse@example.com" →
// "a***@e***.com", "12345678901" → "*******8901". Unknown fields and values
// that do not fit their field's shape are masked completely. The output never
// contains the input.
func Mask(field, value string) string {
	v := strings.TrimSpace(value)
	if v == "" {
		return Masked
	}
	switch field {
	case FieldName:
		return maskName(v)
	case FieldEmail:
		return maskEmail(v)
	case FieldTaxID:
		return maskTaxID(v)
	}
	return Masked
}

func maskName(v string) string {
	words := strings.Fields(v)
	out := make([]string, 0, len(words))
	for _, w := range words {
		r, _ := utf8.DecodeRuneInString(w)
		if !unicode.IsLetter(r) {
			out = append(out, Masked)
			continue
		}
		out = append(out, string(r)+Masked)
	}
	if len(out) == 0 || len(out) > 6 {
		return Masked
	}
	return strings.Join(out, " ")
}

func maskEmail(v string) string {
	at := strings.LastIndexByte(v, '@')
	if at < 0 {
		return Masked
	}
	local, domain := v[:at], v[at+1:]
	label, tld := domain, ""
	if dot := strings.LastIndexByte(domain, '.'); dot >= 0 {
		label, tld = domain[:dot], domain[dot+1:]
	}
	if !plainTLD(tld) {
		tld = ""
	}
	var b strings.Builder
	b.WriteString(firstLetterOrDigit(local))
	b.WriteString(Masked)
	b.WriteByte('@')
	b.WriteString(firstLetterOrDigit(label))
	b.WriteString(Masked)
	if tld != "" {
		b.WriteByte('.')
		b.WriteString(tld)
	}
	return b.String()
}

// plainTLD: a short run of ASCII letters, which identifies no one.
func plainTLD(s string) bool {
	if len(s) < 2 || len(s) > 6 {
		return false
	}
	for _, r := range s {
		if r < 'a' || r > 'z' {
			if r < 'A' || r > 'Z' {
				return false
			}
		}
	}
	return true
}

func firstLetterOrDigit(s string) string {
	r, _ := utf8.DecodeRuneInString(s)
	if r == utf8.RuneError || !(unicode.IsLetter(r) || unicode.IsDigit(r)) {
		return ""
	}
	return string(r)
}

func maskTaxID(v string) string {
	runes := []rune(Normalize(FieldTaxID, v))
	// Show the last four only when at least four more stay hidden; a fixed
	// number of stars hides the length.
	if len(runes) < 8 {
		return "*******"
	}
	tail := runes[len(runes)-4:]
	for _, r := range tail {
		if !(unicode.IsDigit(r) || unicode.IsLetter(r)) {
			return "*******"
		}
	}
	return "*******" + string(tail)
}
