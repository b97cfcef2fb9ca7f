package pii

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// The fields of a payment's customer column, which are also the fields
// blind indexes are computed for.
const (
	FieldName  = "name"
	FieldEmail = "email"
	FieldTaxID = "tax_id"
)

// What a masked field shows when nothing of it may be shown.
const (
	Masked    = "***"         // a name or email whose shape gives no safe hint
	Redacted  = "[redacted]"  // an address, free text, an undeclared field
	Encrypted = "[encrypted]" // a sealed value shown without the keys to open it
)

// Mask hides a value according to its rule, keeping only hints an operator
// needs to tell values apart: "Ayşe Yılmaz" → "A*** Y***",
// "ayse@example.com" → "a***@e***.com", a tax id or phone → its last two
// characters. Values that do not fit their rule's shape are masked
// completely, and only Safe returns its input: the output of every other
// rule never contains the input.
func Mask(rule Rule, value string) string {
	if rule == Safe {
		return value
	}
	v := strings.TrimSpace(value)
	if v == "" {
		return Masked
	}
	switch rule {
	case Name:
		return maskName(v)
	case Email:
		return maskEmail(v)
	case TaxID:
		return maskTail(Normalize(FieldTaxID, v), unicode.IsLetter)
	case Phone:
		return maskTail(strings.Map(func(r rune) rune {
			if r >= '0' && r <= '9' {
				return r
			}
			return -1
		}, v), nil)
	}
	return Redacted
}

// MaskRecord is what a screen shows of one record of table: each field
// masked by the table's schema (fields it does not declare, and every field
// of a table without a schema, are redacted). A value that could not be
// decrypted stays Undecryptable; a value still sealed shows as Encrypted.
func MaskRecord(table string, fields map[string]string) map[string]string {
	schema := tableSchemas[table]
	out := make(map[string]string, len(fields))
	for f, v := range fields {
		rule := schema[f]
		switch {
		case rule == Safe:
			out[f] = v
		case v == Undecryptable:
			out[f] = Undecryptable
		case IsEnvelope(v):
			out[f] = Encrypted
		default:
			out[f] = Mask(rule, v)
		}
	}
	return out
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

// maskTail shows the last two characters of v (digits, or letters too when
// extra allows them) behind a fixed run of stars that hides the length, and
// only when at least four more stay hidden.
func maskTail(v string, extra func(rune) bool) string {
	const stars = "*******"
	runes := []rune(v)
	if len(runes) < 6 {
		return stars
	}
	for _, r := range runes {
		if !(unicode.IsDigit(r) || extra != nil && extra(r)) {
			return stars
		}
	}
	return stars + string(runes[len(runes)-2:])
}
