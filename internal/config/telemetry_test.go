package config

import (
	"strings"
	"testing"
)

// Tracing is off unless asked for; an endpoint alone turns OTLP on; the
// variables reach the typed config.
func TestTelemetryConfigIsOffByDefault(t *testing.T) {
	t.Parallel()
	base := map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1/db", "BROKER_URL": "nats://127.0.0.1:4222"}
	c, err := parseRelay(t, base)
	if err != nil {
		t.Fatal(err)
	}
	if c.Telemetry.Enabled() {
		t.Fatalf("tracing on by default: %+v", c.Telemetry)
	}
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://collector.example/v1/traces"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, false},
	} {
		m := map[string]string{"OTEL_SERVICE_NAME": "relay-eu"}
		for k, v := range base {
			m[k] = v
		}
		for k, v := range tc.env {
			m[k] = v
		}
		c, err := parseRelay(t, m)
		if err != nil {
			t.Fatalf("%v: %v", tc.env, err)
		}
		if c.Telemetry.Enabled() != tc.want || c.Telemetry.ServiceName != "relay-eu" {
			t.Errorf("%v: enabled %v (want %v), service %q", tc.env, c.Telemetry.Enabled(), tc.want, c.Telemetry.ServiceName)
		}
	}
}

// Malformed OTEL settings that Sluice parses itself stop start-up with a
// line naming the variable.
func TestTelemetryConfigRefusesMalformedSettings(t *testing.T) {
	t.Parallel()
	base := map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1/db", "BROKER_URL": "nats://127.0.0.1:4222"}
	for _, tc := range []struct{ env, value string }{
		{"OTEL_TRACES_EXPORTER", "jaeger"},
		{"OTEL_TRACES_EXPORTER", "otlp,console"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "127.0.0.1:4318"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "grpc://127.0.0.1:4317"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://user:secret@127.0.0.1:4318"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "not a url"},
		{"OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"},
		{"OTEL_SERVICE_NAME", "two\nlines"},
		{"OTEL_SDK_DISABLED", "maybe"},
	} {
		m := map[string]string{tc.env: tc.value}
		for k, v := range base {
			m[k] = v
		}
		_, err := parseRelay(t, m)
		if err == nil || !strings.Contains(err.Error(), tc.env) {
			t.Errorf("%s=%q: error %v, want one naming %s", tc.env, tc.value, err, tc.env)
		}
	}
}

// CONSOLE_TRACE_URL is optional; when set it must be an http(s) URL that
// says where the trace id goes.
func TestConsoleTraceURL(t *testing.T) {
	t.Parallel()
	c, err := parseConsole(t, map[string]string{"CONSOLE_TRACE_URL": "https://jaeger.example/trace/{trace_id}"})
	if err != nil || c.TraceURL != "https://jaeger.example/trace/{trace_id}" {
		t.Fatalf("trace URL %q, %v", c.TraceURL, err)
	}
	for _, bad := range []string{"https://jaeger.example/trace/", "javascript:alert(1)//{trace_id}", "/trace/{trace_id}"} {
		if _, err := parseConsole(t, map[string]string{"CONSOLE_TRACE_URL": bad}); err == nil || !strings.Contains(err.Error(), "CONSOLE_TRACE_URL") {
			t.Errorf("%q: error %v, want one naming CONSOLE_TRACE_URL", bad, err)
		}
	}
}
