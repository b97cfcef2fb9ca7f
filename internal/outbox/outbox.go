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
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/db"
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
	Headers       map[string]string // optional; names and values as broker.CheckHeader allows
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
	w, err := Prepare(ctx, ev)
	if err != nil {
		return Inserted{}, err
	}
	return w.Insert(ctx, tx)
}

// insertStmt is Insert's statement, built and rewritten to $n once: it is
// every producer's hot path.
var insertStmt = db.NewNamed(`WITH ` + WriteSQL("ev", "(SELECT 1) AS one", "@ev_payload::jsonb") + ` SELECT aggregate_seq FROM ev`)

// Insert writes w in the caller's transaction tx, as Insert does.
func (w Write) Insert(ctx context.Context, tx pgx.Tx) (Inserted, error) {
	args := pgx.NamedArgs{}
	w.Bind(args, "ev")
	var seq int64
	err := tx.QueryRow(ctx, insertStmt.SQL(), insertStmt.Args(args)...).Scan(&seq)
	if err != nil {
		return Inserted{}, fmt.Errorf("outbox: insert %s: %w", w.ev.EventType, err)
	}
	return Inserted{ID: w.ID, AggregateSeq: seq}, nil
}

// Write is an event checked and completed (its id, its trace headers) for
// a statement that writes it: Insert's, or a caller's own statement that
// writes the event with its business rows in one round trip (WriteSQL).
type Write struct {
	ID          uuid.UUID
	ev          Event
	headers     []byte
	availableAt *time.Time
}

// Prepare checks ev and completes it as Insert does: a UUIDv7 id when
// ev.ID is zero, and the W3C trace context of ctx in its headers.
func Prepare(ctx context.Context, ev Event) (Write, error) {
	if err := ev.validate(); err != nil {
		return Write{}, err
	}
	id := ev.ID
	if id == uuid.Nil {
		var err error
		if id, err = uuid.NewV7(); err != nil {
			return Write{}, fmt.Errorf("outbox: new id: %w", err)
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
			return Write{}, fmt.Errorf("%w: headers: %v", ErrInvalidEvent, err)
		}
	}
	w := Write{ID: id, ev: ev, headers: headers}
	if !ev.AvailableAt.IsZero() {
		w.availableAt = &ev.AvailableAt
	}
	return w, nil
}

// Bind sets the named arguments of WriteSQL(name, …) in args: @<name>_id,
// _agg_type, _agg_id, _topic, _type, _headers, _available and _payload (the
// event's payload as given, for the caller's payload expression to use).
func (w Write) Bind(args pgx.NamedArgs, name string) {
	args[name+"_id"] = w.ID
	args[name+"_agg_type"] = w.ev.AggregateType
	args[name+"_agg_id"] = w.ev.AggregateID
	args[name+"_topic"] = w.ev.Topic
	args[name+"_type"] = w.ev.EventType
	args[name+"_headers"] = w.headers
	args[name+"_available"] = w.availableAt
	args[name+"_payload"] = string(w.ev.Payload)
}

// WriteSQL is the one statement that writes an event, as two WITH items:
// <name>_seq takes the aggregate's next sequence number (concurrent writers
// of one aggregate wait for each other until their transactions end, so
// sequence order is commit order) and <name> inserts the event, RETURNING
// aggregate_seq. Both happen only when from, a FROM item that yields at
// most one row (an earlier WITH item's name, or "(SELECT 1) AS one" to
// write unconditionally), has its row, and payload is a jsonb expression
// that may use from's columns: a caller whose
// payload carries values the statement computes (an attempt number, the
// database's time) completes @<name>_payload::jsonb there. Bind the
// arguments with Write.Bind.
func WriteSQL(name, from, payload string) string {
	return name + `_seq AS (
			INSERT INTO outbox_aggregate (aggregate_type, aggregate_id, last_seq)
			SELECT @` + name + `_agg_type, @` + name + `_agg_id, 1 FROM ` + from + `
			ON CONFLICT (aggregate_type, aggregate_id)
			DO UPDATE SET last_seq = outbox_aggregate.last_seq + 1
			RETURNING last_seq),
		` + name + ` AS (
			INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, headers, available_at)
			SELECT @` + name + `_id, @` + name + `_agg_type, @` + name + `_agg_id, s.last_seq, @` + name + `_topic, @` + name + `_type,
				` + payload + `, @` + name + `_headers, coalesce(@` + name + `_available::timestamptz, now())
			FROM ` + from + `, ` + name + `_seq s
			RETURNING aggregate_seq)`
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
	// A producer's header must neither pass for one of the system's (a
	// Sluice-Replay-To had every other consumer acknowledge the event
	// unapplied, a Sluice-Event-Id deduplicated two events as one) nor be
	// one a broker cannot carry (a RabbitMQ header name over 255 bytes
	// closed the relay's connection with its whole batch in flight).
	// Sorted, so the error names the same header every time.
	for _, name := range slices.Sorted(maps.Keys(ev.Headers)) {
		if err := broker.CheckHeader(name, ev.Headers[name]); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidEvent, err)
		}
	}
	return nil
}
