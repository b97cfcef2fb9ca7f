package live

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/payments"
)

// A detail page watches the one record it shows. Its socket subscribes with
// the record (SubscribeRecord); once per tick, and only when some socket
// watches a record, the feed reads the states of every watched record in
// one statement by primary key (each room's part: outbox.EventStatesRead,
// payments.PaymentStatesRead) and keeps them. Each socket then compares its
// record's state (Record) with the state its page showed, without a query
// of its own: the cost is one statement per tick per process, whatever the
// number of sockets and records.

// Kinds of watched records.
const (
	KindEvent   = "event"   // an outbox event (GET /outbox/{id})
	KindPayment = "payment" // a payment (GET /payments/{operation_id})
)

// MaxWatched bounds the records of one kind the feed reads per tick. A
// socket whose record would be one more is subscribed without it: its page
// hears nothing about its record (never something wrong), and the feed
// counts it (WatchStats).
const MaxWatched = 1000

// Watch names a record a socket watches.
type Watch struct {
	Kind string
	ID   uuid.UUID
}

// RecordState is a watched record's state as the feed last read it.
type RecordState struct {
	At      time.Time             // the read's time (database clock)
	Found   bool                  // false: the row is gone (a published event pruned)
	Event   outbox.EventState     // KindEvent
	Payment payments.PaymentState // KindPayment
}

// watchSet counts the sockets watching each record, per kind.
type watchSet map[string]map[uuid.UUID]int

// add counts one more socket watching w, unless w would be a record beyond
// MaxWatched of its kind.
func (s watchSet) add(w Watch) bool {
	ids := s[w.Kind]
	if ids == nil {
		ids = map[uuid.UUID]int{}
		s[w.Kind] = ids
	}
	if _, ok := ids[w.ID]; !ok && len(ids) >= MaxWatched {
		return false
	}
	ids[w.ID]++
	return true
}

func (s watchSet) remove(w Watch) {
	if s[w.Kind][w.ID]--; s[w.Kind][w.ID] <= 0 {
		delete(s[w.Kind], w.ID)
	}
}

// ids lists the records of kind watched, sorted (a stable statement
// argument; the order the primary key reads them in).
func (s watchSet) ids(kind string) []uuid.UUID {
	out := make([]uuid.UUID, 0, len(s[kind]))
	for id := range s[kind] {
		out = append(out, id)
	}
	slices.SortFunc(out, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	return out
}

// recordReads are the rooms' parts of the watched records' statement.
type recordReads struct {
	events   outbox.EventStatesRead
	payments payments.PaymentStatesRead
}

// all is the parts with records to read: a kind nobody watches is no part.
func (r *recordReads) all() []db.Read {
	var out []db.Read
	if len(r.events.IDs) > 0 {
		out = append(out, &r.events)
	}
	if len(r.payments.IDs) > 0 {
		out = append(out, &r.payments)
	}
	return out
}

// RecordsQuery is the statement the feed runs for these watched records
// (for plan tests).
func RecordsQuery(events, pays []uuid.UUID) (string, []any) {
	r := recordReads{events: outbox.EventStatesRead{IDs: events}, payments: payments.PaymentStatesRead{IDs: pays}}
	return db.Compose(r.all()...)
}

// ReadRecords reads the states of the watched records in one statement; an
// id with no row is in the result with Found false. Nothing watched: no
// statement, an empty result.
func ReadRecords(ctx context.Context, q Querier, events, pays []uuid.UUID) (map[Watch]RecordState, error) {
	r := recordReads{events: outbox.EventStatesRead{IDs: events}, payments: payments.PaymentStatesRead{IDs: pays}}
	reads := r.all()
	if len(reads) == 0 {
		return map[Watch]RecordState{}, nil
	}
	at, err := db.ReadAll(ctx, q, reads...)
	if err != nil {
		return nil, fmt.Errorf("live: watched records: %w", err)
	}
	out := make(map[Watch]RecordState, len(events)+len(pays))
	for _, id := range events {
		out[Watch{KindEvent, id}] = RecordState{At: at}
	}
	for _, id := range pays {
		out[Watch{KindPayment, id}] = RecordState{At: at}
	}
	for _, s := range r.events.States {
		out[Watch{KindEvent, s.ID}] = RecordState{At: at, Found: true, Event: s}
	}
	for _, s := range r.payments.States {
		out[Watch{KindPayment, s.OperationID}] = RecordState{At: at, Found: true, Payment: s}
	}
	return out, nil
}
