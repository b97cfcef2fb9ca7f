package telemetry

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"
)

func TestTraceIDOf(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01": "4bf92f3577b34da6a3ce929d0e0e4736",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-00": "4bf92f3577b34da6a3ce929d0e0e4736",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01": "",
		"00-4bf92f3577b34da6a3ce929d0e0e473z-00f067aa0ba902b7-01": "",
		"00-4bf92f3577b34da6a3ce929d0e0e4736":                     "",
		"<script>":                                                "",
		"":                                                        "",
	} {
		got, ok := TraceIDOf(in)
		if got != want || ok != (want != "") {
			t.Errorf("TraceIDOf(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

// Inject writes the context's span context and never overwrites a
// traceparent already set; a context without one writes nothing.
func TestInjectAndExtract(t *testing.T) {
	t.Parallel()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := Extract(context.Background(), map[string]string{HeaderTraceparent: tp, HeaderTracestate: "a=b"})
	h := map[string]string{}
	Inject(ctx, h)
	if h[HeaderTraceparent] != tp || h[HeaderTracestate] != "a=b" {
		t.Fatalf("injected %v", h)
	}
	kept := map[string]string{HeaderTraceparent: "00-11111111111111111111111111111111-2222222222222222-01"}
	Inject(ctx, kept)
	if kept[HeaderTraceparent] != "00-11111111111111111111111111111111-2222222222222222-01" {
		t.Fatalf("overwrote a set traceparent: %v", kept)
	}
	empty := map[string]string{}
	Inject(context.Background(), empty)
	if len(empty) != 0 {
		t.Fatalf("injected %v from a context without a span", empty)
	}
	// A span of an SDK provider is the parent of what Inject writes.
	sdk := sdktrace.NewTracerProvider()
	sctx, span := Tracer(sdk).Start(ctx, "x")
	defer span.End()
	h = map[string]string{}
	propagation.TraceContext{}.Inject(sctx, propagation.MapCarrier(h))
	got := map[string]string{}
	Inject(sctx, got)
	if got[HeaderTraceparent] != h[HeaderTraceparent] {
		t.Fatalf("Inject %v, propagator %v", got, h)
	}
}

// Off by default: a no-op provider, nothing to flush.
func TestStartIsANoopWhenOff(t *testing.T) {
	t.Parallel()
	tr, err := Start(context.Background(), Config{}, "sluice-test")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tr.Provider().(noop.TracerProvider); !ok {
		t.Fatalf("provider %T, want the no-op one", tr.Provider())
	}
	if err := tr.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	on, err := Start(context.Background(), Config{Endpoint: "http://127.0.0.1:1"}, "sluice-test")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := on.Provider().(*sdktrace.TracerProvider); !ok {
		t.Fatalf("provider %T with an endpoint, want the SDK's", on.Provider())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // nothing listens on port 1: do not wait for the flush
	_ = on.Close(ctx)
}

// A statement inside a recorded span gets a child span with its text; one
// outside any (background polling) gets none.
func TestQueryTracerSpansOnlyInsideATrace(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	q := NewQueryTracer(tp)
	ctx := q.TraceQueryStart(context.Background(), nil, pgx.TraceQueryStartData{SQL: "SELECT 1"})
	q.TraceQueryEnd(ctx, nil, pgx.TraceQueryEndData{})
	if n := len(exp.GetSpans()); n != 0 {
		t.Fatalf("%d spans outside a trace", n)
	}
	pctx, parent := Tracer(tp).Start(context.Background(), "request")
	ctx = q.TraceQueryStart(pctx, nil, pgx.TraceQueryStartData{SQL: "\n\t\tINSERT INTO payment (a) VALUES ($1)", Args: []any{"secret@example.com"}})
	q.TraceQueryEnd(ctx, nil, pgx.TraceQueryEndData{})
	parent.End()
	spans := exp.GetSpans()
	if len(spans) != 2 || spans[0].Name != "db INSERT" || spans[0].Parent.SpanID() != parent.SpanContext().SpanID() {
		t.Fatalf("spans %+v", spans)
	}
	for _, a := range spans[0].Attributes {
		if strings.Contains(a.Value.String(), "secret@example.com") {
			t.Errorf("attribute %s carries an argument", a.Key)
		}
	}
}
