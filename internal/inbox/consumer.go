package inbox

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/telemetry"
)

// Effect applies one message inside the inbox's transaction.
type Effect func(ctx context.Context, tx pgx.Tx, msg broker.Message) error

// Consumer subscribes a named consumer to a broker and applies Effect once
// per message through the inbox: `console consume` and the demo run it.
type Consumer struct {
	Inbox  *Inbox
	Name   string // durable subscription and inbox consumer name
	Effect Effect // nil: RecordEffect
	// Tracing (nil: none) makes one consumer span per handled message,
	// child of the trace context its headers carry (the relay's publish
	// span, or the request that wrote the event).
	Tracing trace.TracerProvider
	// ReportInterval is how often Run reports the process in
	// inbox_consumer_process for the console (default
	// DefaultReportInterval).
	ReportInterval time.Duration

	applied, duplicates, stale atomic.Int64
	act                        activity
}

// ConsumerCounts are what a Consumer did since it started.
type ConsumerCounts struct{ Applied, Duplicates, Stale int64 }

// Counts returns the running totals (the demo prints them).
func (c *Consumer) Counts() ConsumerCounts {
	return ConsumerCounts{Applied: c.applied.Load(), Duplicates: c.duplicates.Load(), Stale: c.stale.Load()}
}

// Run consumes until ctx ends, reporting the process meanwhile.
// A run that ends on an error (the subscriber gave up) does not sign off.
func (c *Consumer) Run(ctx context.Context, sub broker.Subscriber) (err error) {
	stop := newPresence(c.Inbox, c.Name, 0, nil, c.ReportInterval, &c.applied, &c.act).start(ctx)
	defer func() { stop(err == nil || ctx.Err() != nil) }()
	return sub.Subscribe(ctx, c.Name, c.Handle)
}

// Handle is the broker.Handler: messages carrying an aggregate sequence go
// through HandleVersioned (stale ones dropped), others through Handle. An
// error leaves the message unacknowledged; the subscriber tries it again.
func (c *Consumer) Handle(ctx context.Context, msg broker.Message) (err error) {
	var span trace.Span
	if c.Tracing != nil {
		ctx, span = startHandleSpan(ctx, c.Tracing, c.Name, msg)
		defer func() {
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, "effect failed")
			}
			span.End()
		}()
	}
	effect := c.Effect
	if effect == nil {
		effect = RecordEffect(c.Name)
	}
	fn := func(tx pgx.Tx) error { return effect(ctx, tx, msg) }
	var res Result
	if msg.AggregateSeq > 0 && msg.AggregateType != "" && msg.AggregateID != "" {
		res, err = c.Inbox.HandleVersioned(ctx, c.Name, msg.ID,
			Version{AggregateType: msg.AggregateType, AggregateID: msg.AggregateID, Seq: msg.AggregateSeq}, fn)
	} else {
		res, err = c.Inbox.Handle(ctx, c.Name, msg.ID, fn)
	}
	if err != nil {
		c.act.didFail()
		// The subscriber retries this message in place; say why it waits.
		c.Inbox.log.Warn("inbox: effect failed; will retry", "consumer", c.Name, "message_id", msg.ID, "err", err)
		return fmt.Errorf("inbox: consumer %s, message %s: %w", c.Name, msg.ID, err)
	}
	if span != nil {
		span.SetAttributes(attribute.String("sluice.inbox.result", res.String()))
	}
	switch res {
	case Applied:
		c.act.didApply()
		c.applied.Add(1)
	case Duplicate:
		c.duplicates.Add(1)
	case Stale:
		c.stale.Add(1)
	}
	return nil
}

// RecordEffect is the reference consumer's effect: one consume_effect row
// per applied event (no payload: it may carry encrypted personal data). The
// table has no unique key on the event id on purpose, so an effect applied
// twice would be visible as two rows.
//
// It reads no payload field, so it decrypts nothing and needs no keyring:
// a consumer that does need a sealed field opens only that one, with
// pii.OpenPayloadField(kr, msg.EventType, msg.ID, msg.Payload, path) (the
// fields are bound to the event's type and id).
func RecordEffect(consumer string) Effect {
	return func(ctx context.Context, tx pgx.Tx, msg broker.Message) error {
		_, err := tx.Exec(ctx, `
			INSERT INTO consume_effect (consumer, event_id, topic, event_type, aggregate_type, aggregate_id, aggregate_seq)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`,
			consumer, msg.ID, msg.Topic, msg.EventType, msg.AggregateType, msg.AggregateID, msg.AggregateSeq)
		if err != nil {
			return fmt.Errorf("record effect of %s: %w", msg.ID, err)
		}
		return nil
	}
}

// startHandleSpan starts a consumer's span for one message, the child of
// the context the message carries (the relay's publish span, or the request
// that wrote the event), so a trace runs from the caller to the effect.
func startHandleSpan(ctx context.Context, tp trace.TracerProvider, consumer string, msg broker.Message) (context.Context, trace.Span) {
	return telemetry.Tracer(tp).Start(telemetry.Extract(ctx, msg.Headers), "handle "+msg.Topic,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", msg.Topic),
			attribute.String("messaging.consumer.group.name", consumer),
			attribute.String("messaging.message.id", msg.ID),
			attribute.String("sluice.event_type", msg.EventType),
		))
}
