// Package outbox is the transactional outbox: Insert writes an event in the
// caller's transaction, and the Relay publishes committed events to a broker
// at least once (claim → publish → mark), with backoff, dead-lettering and
// per-aggregate order.
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/internal/telemetry"
)

// Status words of outbox_event.status. A pending event under a live lease
// is in flight; with ordering on, a pending or dead event holds the later
// events of its aggregate, which are held. Published and discarded are
// terminal; discarded is an operator's decision never to publish, and
// releases the aggregate.
const (
	StatusPending   = "pending"
	StatusPublished = "published"
	StatusDead      = "dead"
	StatusDiscarded = "discarded"
)

// Event is one message to publish.
type Event struct {
	ID            uuid.UUID         // set by Insert when zero (UUIDv7)
	AggregateType string            // e.g. "payment"
	AggregateID   string            // e.g. the operation id
	Topic         string            // broker subject / routing key
	EventType     string            // versioned, e.g. "payment.requested.v1"
	Payload       json.RawMessage   // sensitive fields must already be encrypted
	Headers       map[string]string // optional
	AvailableAt   time.Time         // optional: not published before (zero = now)
}

// Inserted is what Insert assigned.
type Inserted struct {
	ID           uuid.UUID
	AggregateSeq int64
}

// ErrInvalidEvent reports an event that cannot be written.
var ErrInvalidEvent = errors.New("outbox: invalid event")

// Insert writes ev in the caller's transaction tx: the event exists if and
// only if tx commits. It assigns a UUIDv7 id when ev.ID is zero and the next
// per-aggregate sequence number; concurrent writers of one aggregate are
// serialized until tx ends, so sequence order is commit order. Insert sends
// no NOTIFY (that would serialize every commit on PostgreSQL's notification
// queue lock); to wake relays before their next poll, call a Notifier's Poke
// after tx commits. When ctx carries a span context (an OpenTelemetry span,
// or a traceparent a request brought), its traceparent and tracestate are
// stored in the event's headers, unless ev.Headers sets a traceparent.
func Insert(ctx context.Context, tx pgx.Tx, ev Event) (Inserted, error) {
	if err := ev.validate(); err != nil {
		return Inserted{}, err
	}
	id := ev.ID
	if id == uuid.Nil {
		var err error
		if id, err = uuid.NewV7(); err != nil {
			return Inserted{}, fmt.Errorf("outbox: new id: %w", err)
		}
	}
	// The caller's W3C trace context travels with the event, so the relay
	// and the consumer continue the trace of the request that wrote it.
	hdr := ev.Headers
	if trace.SpanContextFromContext(ctx).IsValid() {
		if _, set := hdr[telemetry.HeaderTraceparent]; !set {
			hdr = make(map[string]string, len(ev.Headers)+2)
			maps.Copy(hdr, ev.Headers)
			telemetry.Inject(ctx, hdr)
		}
	}
	headers := []byte("{}")
	if len(hdr) > 0 {
		var err error
		if headers, err = json.Marshal(hdr); err != nil {
			return Inserted{}, fmt.Errorf("%w: headers: %v", ErrInvalidEvent, err)
		}
	}
	var availableAt *time.Time
	if !ev.AvailableAt.IsZero() {
		availableAt = &ev.AvailableAt
	}
	var seq int64
	err := tx.QueryRow(ctx, `
		WITH seq AS (
			INSERT INTO outbox_aggregate (aggregate_type, aggregate_id, last_seq)
			VALUES ($2, $3, 1)
			ON CONFLICT (aggregate_type, aggregate_id)
			DO UPDATE SET last_seq = outbox_aggregate.last_seq + 1
			RETURNING last_seq
		)
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, headers, available_at)
		SELECT $1, $2, $3, seq.last_seq, $4, $5, $6, $7, coalesce($8, now()) FROM seq
		RETURNING aggregate_seq`,
		id, ev.AggregateType, ev.AggregateID, ev.Topic, ev.EventType, []byte(ev.Payload), headers, availableAt,
	).Scan(&seq)
	if err != nil {
		return Inserted{}, fmt.Errorf("outbox: insert %s: %w", ev.EventType, err)
	}
	return Inserted{ID: id, AggregateSeq: seq}, nil
}

func (ev Event) validate() error {
	switch {
	case ev.AggregateType == "":
		return fmt.Errorf("%w: aggregate type is empty", ErrInvalidEvent)
	case ev.AggregateID == "":
		return fmt.Errorf("%w: aggregate id is empty", ErrInvalidEvent)
	case ev.Topic == "" || len(ev.Topic) > 200:
		return fmt.Errorf("%w: topic must be 1–200 characters", ErrInvalidEvent)
	case ev.EventType == "" || len(ev.EventType) > 200:
		return fmt.Errorf("%w: event type must be 1–200 characters", ErrInvalidEvent)
	case !json.Valid(ev.Payload):
		return fmt.Errorf("%w: payload is not valid JSON", ErrInvalidEvent)
	}
	return nil
}
