package config

import (
	"net/url"
	"strings"

	"github.com/sluice-dev/sluice/internal/telemetry"
)

// Telemetry is the tracing part of every long-running subcommand, from the
// standard OpenTelemetry variables (each with a flag twin). Tracing is off
// unless OTEL_TRACES_EXPORTER=otlp or an OTLP endpoint is set; the exporter
// also honours the other standard OTEL_EXPORTER_OTLP_* and OTEL_TRACES_SAMPLER*
// variables, which it reads itself.
type Telemetry struct {
	telemetry.Config
}

func (c *Telemetry) register(f *Flags) {
	f.String(&c.Exporter, "otel-traces-exporter", "OTEL_TRACES_EXPORTER", "",
		"none or otlp (default: otlp when an OTLP endpoint is set, else none: tracing off)")
	f.String(&c.Endpoint, "otel-exporter-otlp-endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT", "",
		"OTLP/HTTP collector base URL, e.g. http://127.0.0.1:4318 (traces go to /v1/traces)")
	f.String(&c.TracesEndpoint, "otel-exporter-otlp-traces-endpoint", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "",
		"full OTLP/HTTP traces URL (overrides the base endpoint)")
	f.String(&c.Protocol, "otel-exporter-otlp-protocol", "OTEL_EXPORTER_OTLP_PROTOCOL", "",
		"OTLP protocol: http/protobuf (the only one supported)")
	f.String(&c.ServiceName, "otel-service-name", "OTEL_SERVICE_NAME", "", "service name on the spans (default: sluice-<subcommand>)")
	f.Bool(&c.Disabled, "otel-sdk-disabled", "OTEL_SDK_DISABLED", false, "true: no tracing whatever else is set")
}

func (c *Telemetry) check(ck *Check) {
	switch strings.TrimSpace(c.Exporter) {
	case "", telemetry.ExporterNone, telemetry.ExporterOTLP:
	default:
		ck.Failf("OTEL_TRACES_EXPORTER must be none or otlp (got %q)", c.Exporter)
	}
	checkOTLPURL(ck, "OTEL_EXPORTER_OTLP_ENDPOINT", c.Endpoint)
	checkOTLPURL(ck, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", c.TracesEndpoint)
	switch c.Protocol {
	case "", "http/protobuf":
	default:
		ck.Failf("OTEL_EXPORTER_OTLP_PROTOCOL: only http/protobuf is supported (got %q)", c.Protocol)
	}
	if len(c.ServiceName) > 255 || strings.ContainsAny(c.ServiceName, "\r\n") {
		ck.Failf("OTEL_SERVICE_NAME must be one line of at most 255 characters")
	}
}

func checkOTLPURL(ck *Check, env, v string) {
	if !ck.URL(env, v, "http", "https") {
		return
	}
	u, _ := url.Parse(v)
	if u.User != nil {
		ck.Failf("%s must not carry credentials (use OTEL_EXPORTER_OTLP_HEADERS)", env)
	}
}

func registerTraceURL(f *Flags, p *string) {
	f.String(p, "trace-url", "CONSOLE_TRACE_URL", "",
		"trace UI address with {trace_id}, e.g. https://jaeger.example/trace/{trace_id}: the trace page links trace ids there (empty: shown to copy)")
}

// checkTraceURL: an absolute http(s) URL that says where the id goes.
func checkTraceURL(ck *Check, v string) {
	if v == "" {
		return
	}
	if !ck.URL("CONSOLE_TRACE_URL", strings.ReplaceAll(v, "{trace_id}", "0"), "https", "http") {
		return
	}
	if !strings.Contains(v, "{trace_id}") {
		ck.Failf("CONSOLE_TRACE_URL must contain {trace_id} where the trace id goes (got %q)", v)
	}
}
