// Package telemetry is Sluice's one place for OpenTelemetry tracing: the
// tracer provider a process builds from the standard OTEL_* settings (off
// by default: a no-op tracer, no exporter), and the W3C trace context
// (traceparent, tracestate) that travels in an outbox event's headers from
// the writer, through the relay and the broker, to the consumer.
//
// Nothing here is global: each process builds one Tracing and hands its
// TracerProvider to the parts that make spans.
package telemetry

import (
	"context"
	"encoding/hex"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Instrumentation names Sluice's tracers.
const Instrumentation = "github.com/sluice-dev/sluice"

// Header names of the W3C trace context, as stored in an event's headers.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// Exporters OTEL_TRACES_EXPORTER may name.
const (
	ExporterNone = "none"
	ExporterOTLP = "otlp"
)

// Config is the tracing part of a process's configuration, from the
// standard OpenTelemetry variables (internal/config reads and checks it).
type Config struct {
	// Exporter (OTEL_TRACES_EXPORTER): "none" or "otlp". Empty: otlp when
	// an OTLP endpoint is set, else none, so tracing is off unless asked for.
	Exporter string
	// Endpoint (OTEL_EXPORTER_OTLP_ENDPOINT) is the collector's base URL
	// (the exporter appends /v1/traces); TracesEndpoint
	// (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) the full traces URL, used as is.
	Endpoint       string
	TracesEndpoint string
	// Protocol (OTEL_EXPORTER_OTLP_PROTOCOL): only http/protobuf.
	Protocol string
	// ServiceName (OTEL_SERVICE_NAME); empty: the process's default.
	ServiceName string
	// Disabled (OTEL_SDK_DISABLED) turns tracing off whatever else is set.
	Disabled bool
}

// Enabled reports whether the configuration asks for an exporter.
func (c Config) Enabled() bool {
	if c.Disabled {
		return false
	}
	switch strings.TrimSpace(c.Exporter) {
	case ExporterOTLP:
		return true
	case "":
		return c.Endpoint != "" || c.TracesEndpoint != ""
	}
	return false
}

// Tracing is one process's tracer provider.
type Tracing struct {
	tp       trace.TracerProvider
	shutdown func(context.Context) error
}

// Start builds the tracer provider cfg asks for: a no-op one when tracing
// is off (no exporter, nothing recorded), else a batching OTLP/HTTP
// exporter. The exporter also honours the other standard OTLP variables
// (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, …) and the SDK the
// sampler ones (OTEL_TRACES_SAMPLER, _ARG; default parent-based always-on).
// defaultService names the process when OTEL_SERVICE_NAME is empty.
func Start(ctx context.Context, cfg Config, defaultService string) (*Tracing, error) {
	if !cfg.Enabled() {
		return &Tracing{tp: noop.NewTracerProvider(), shutdown: func(context.Context) error { return nil }}, nil
	}
	var opts []otlptracehttp.Option
	switch {
	case cfg.TracesEndpoint != "":
		opts = append(opts, otlptracehttp.WithEndpointURL(cfg.TracesEndpoint))
	case cfg.Endpoint != "":
		opts = append(opts, otlptracehttp.WithEndpointURL(strings.TrimSuffix(cfg.Endpoint, "/")+"/v1/traces"))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP exporter: %w", err)
	}
	name := cfg.ServiceName
	if name == "" {
		name = defaultService
	}
	res := resource.NewSchemaless(semconv.ServiceName(name))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Tracing{tp: tp, shutdown: tp.Shutdown}, nil
}

// NewTracing wraps a tracer provider the caller built (tests: an SDK
// provider over an in-memory exporter).
func NewTracing(tp trace.TracerProvider) *Tracing {
	return &Tracing{tp: tp, shutdown: func(context.Context) error { return nil }}
}

// Provider is the tracer provider to hand to the parts that make spans.
func (t *Tracing) Provider() trace.TracerProvider { return t.tp }

// Close flushes the spans not yet exported and stops the exporter.
func (t *Tracing) Close(ctx context.Context) error { return t.shutdown(ctx) }

// Tracer is tp's Sluice tracer; a nil tp gives a no-op tracer.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer(Instrumentation)
}

// propagator reads and writes the W3C trace context only; it holds no
// state.
var propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Inject writes ctx's span context into headers (traceparent, and
// tracestate when there is one). It writes nothing when ctx carries no
// valid span context, and never overwrites a traceparent already set.
func Inject(ctx context.Context, headers map[string]string) {
	if _, ok := headers[HeaderTraceparent]; ok {
		return
	}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	propagator.Inject(ctx, propagation.MapCarrier(headers))
}

// Extract returns ctx with the remote span context of headers (if any)
// as the parent of the spans started from it.
func Extract(ctx context.Context, headers map[string]string) context.Context {
	if headers[HeaderTraceparent] == "" {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier(headers))
}

// ExtractHTTP is Extract for an HTTP request's headers.
func ExtractHTTP(ctx context.Context, h propagation.HeaderCarrier) context.Context {
	return propagator.Extract(ctx, h)
}

// TraceIDOf is the trace id (32 lower-case hex digits) of a W3C
// traceparent header ("00-<trace id>-<parent id>-<flags>"); false when the
// header is malformed or the id is all zeros.
func TraceIDOf(traceparent string) (string, bool) {
	parts := strings.Split(strings.TrimSpace(traceparent), "-")
	if len(parts) < 4 || len(parts[0]) != 2 || len(parts[1]) != 32 || len(parts[2]) != 16 || len(parts[3]) != 2 {
		return "", false
	}
	id := strings.ToLower(parts[1])
	b, err := hex.DecodeString(id)
	if err != nil {
		return "", false
	}
	tid := trace.TraceID(b)
	if !tid.IsValid() {
		return "", false
	}
	return id, true
}
