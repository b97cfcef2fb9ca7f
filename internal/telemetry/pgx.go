package telemetry

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// QueryTracer is a pgx.QueryTracer that makes one client span per
// statement, only inside a span that is being recorded (a traced request),
// so background polling makes none. The span carries the statement's text,
// never its arguments (they may be personal data).
type QueryTracer struct{ tracer trace.Tracer }

// NewQueryTracer is the pgx tracer of tp.
func NewQueryTracer(tp trace.TracerProvider) *QueryTracer { return &QueryTracer{tracer: Tracer(tp)} }

// TraceQueryStart implements pgx.QueryTracer.
func (q *QueryTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ctx
	}
	op := strings.ToUpper(firstWord(data.SQL))
	ctx, _ = q.tracer.Start(ctx, "db "+op, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("db.system.name", "postgresql"),
			attribute.String("db.operation.name", op),
			attribute.String("db.query.text", data.SQL),
		))
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (q *QueryTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	// A recording span here is always the one TraceQueryStart started: it
	// starts one whenever the context it got was recording, and pgx hands
	// back the context it returned.
	if data.Err != nil {
		span.RecordError(data.Err)
		span.SetStatus(codes.Error, "statement failed")
	}
	span.End()
}

func firstWord(sql string) string {
	sql = strings.TrimSpace(sql)
	if i := strings.IndexAny(sql, " \t\n("); i > 0 {
		return sql[:i]
	}
	return sql
}
