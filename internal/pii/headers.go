package pii

import (
	"encoding/json"
	"strings"
)

// headersShown are the event header names whose values a screen shows as
// they are: the W3C trace context the product writes itself
// (telemetry.Inject) and ids that name messages, not people. Headers are
// free-form, written by any producer, so every other value is redacted,
// as a payload field no schema declares is.
var headersShown = map[string]bool{
	"traceparent": true, "tracestate": true, "content-type": true,
	"correlation-id": true, "causation-id": true, "message-id": true, "x-request-id": true,
}

// MaskHeaders is what a screen shows of an event's headers (a JSON object
// of strings): the names, and the values of headersShown (by name, any
// case); every other value, and anything that is not a string, is
// Redacted. Headers that are not a JSON object show as Redacted whole.
func MaskHeaders(headers []byte) []byte {
	var in map[string]any
	if len(headers) == 0 {
		return []byte("{}")
	}
	if err := json.Unmarshal(headers, &in); err != nil || in == nil {
		out, _ := json.Marshal(Redacted)
		return out
	}
	masked := make(map[string]string, len(in))
	for k, v := range in {
		s, isString := v.(string)
		if isString && headersShown[strings.ToLower(k)] {
			masked[k] = s
			continue
		}
		masked[k] = Redacted
	}
	out, err := encode(masked, false)
	if err != nil {
		out, _ = json.Marshal(Redacted)
	}
	return out
}
