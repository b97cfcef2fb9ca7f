package web

import (
	"net/http"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sluice-dev/sluice/internal/telemetry"
)

// requestTracer is nil when tracing is off, so requests do no span work.
func requestTracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	if _, off := tp.(noop.TracerProvider); off {
		return nil
	}
	return telemetry.Tracer(tp)
}

// traced wraps each request in a server span named by its route template,
// so the outbox events a console action writes (outbox.Insert) carry its
// trace context. A browser's traceparent is not trusted: each request
// starts a trace of its own.
func (a *App) traced(next echo.HandlerFunc) echo.HandlerFunc {
	if a.tracer == nil {
		return next
	}
	return func(c echo.Context) error {
		req := c.Request()
		ctx, span := a.tracer.Start(req.Context(), req.Method, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithNewRoot(), trace.WithAttributes(attribute.String("http.request.method", req.Method)))
		defer span.End()
		c.SetRequest(req.WithContext(ctx))
		err := next(c)
		route := c.Path()
		if route == "" {
			route = "unmatched"
		}
		span.SetName(req.Method + " " + route)
		span.SetAttributes(attribute.String("http.route", route))
		if err != nil || c.Response().Status >= http.StatusInternalServerError {
			span.SetStatus(codes.Error, "request failed")
		}
		return err
	}
}
