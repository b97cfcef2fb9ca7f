package broker

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Header names and prefixes the system gives a meaning, compared without
// regard to case: a producer's header must never be read as one of them.
//
//   - "Sluice-": Sluice's own (the Header* names above, and each adapter's:
//     RabbitMQ's Sluice-Publish-Id and Sluice-Topic). A producer's
//     Sluice-Replay-To made every other consumer acknowledge its event
//     unapplied; two events with one Sluice-Event-Id were deduplicated as
//     one; on RabbitMQ a producer's Sluice-Aggregate-Seq replaced the
//     event's own.
//   - "Nats-": JetStream reads these on a publish (Nats-Msg-Id, the one it
//     deduplicates on; Nats-Expected-Stream and the other expectations,
//     which refuse the publish; Nats-Rollup, which purges the subject;
//     Nats-TTL, Nats-Schedule, …).
//   - "CC" and "BCC": RabbitMQ reads them as extra routing keys, and closes
//     the publishing channel (with every publish in flight on it) when one
//     is not a list, as a string header never is.
const (
	reservedPrefixSluice = "sluice-"
	reservedPrefixNATS   = "nats-"
)

var reservedNames = []string{"cc", "bcc"}

// ReservedHeader says whether name is a header the system reserves (see
// above). Adapters drop such a header from a message's producer headers
// before they set their own, so a row another writer put straight into
// outbox_event can never override them; outbox.Insert refuses it.
func ReservedHeader(name string) bool {
	lower := strings.ToLower(name)
	if strings.HasPrefix(lower, reservedPrefixSluice) || strings.HasPrefix(lower, reservedPrefixNATS) {
		return true
	}
	for _, r := range reservedNames {
		if lower == r {
			return true
		}
	}
	return false
}

// MaxHeaderName is the longest header name in bytes: an AMQP field table's
// names are short strings. A longer one made the RabbitMQ client fail the
// frame it was writing and close the connection, with every publish in
// flight on it.
const MaxHeaderName = 255

// headerNameForbidden are the printable ASCII characters a NATS header name
// may not hold (the Go client refuses the publish; ':' ends the name on the
// wire), besides space and control characters.
const headerNameForbidden = `"(),/:;<=>?@[\]{}`

// CheckHeader refuses a producer's header that the system reserves
// (ReservedHeader) or that a broker cannot carry as it is: a name must be 1
// to MaxHeaderName bytes of printable ASCII without space or any of
// "(),/:;<=>?@[\]{}; a value must be UTF-8 (the outbox stores headers as a
// JSON object, which would replace other bytes), without NUL (PostgreSQL's
// jsonb refuses it), CR or LF (NATS turns them into spaces, as a header line
// cannot hold them), and without leading or trailing spaces or tabs (NATS
// trims them).
func CheckHeader(name, value string) error {
	switch {
	case name == "":
		return fmt.Errorf("a header name is empty")
	case len(name) > MaxHeaderName:
		return fmt.Errorf("header %.40q…: the name is %d bytes, more than the %d a RabbitMQ header name holds", name, len(name), MaxHeaderName)
	case ReservedHeader(name):
		return fmt.Errorf("header %q: the name is reserved (Sluice-…, Nats-…, CC and BCC, in any case, carry the system's own values)", name)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(headerNameForbidden, c) >= 0 {
			return fmt.Errorf("header %q: a name is printable ASCII without space or any of %s (NATS header names)", name, headerNameForbidden)
		}
	}
	switch {
	case !utf8.ValidString(value):
		return fmt.Errorf("header %q: the value is not UTF-8", name)
	case strings.ContainsAny(value, "\x00\r\n"):
		return fmt.Errorf("header %q: the value holds a NUL, CR or LF, which the outbox or NATS cannot carry", name)
	case value != strings.Trim(value, " \t"):
		return fmt.Errorf("header %q: the value starts or ends with a space or tab, which NATS trims", name)
	}
	return nil
}
