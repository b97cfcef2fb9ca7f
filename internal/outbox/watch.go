package outbox

import (
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/db"
)

// EventState is what an event's detail page shows that a relay or another
// operator changes after the page was read: its status, attempts, last
// error, publication and lease. The console's feed reads it for the events
// open pages watch (EventStatesRead, once per tick for all of them), and
// each page's socket compares it with the state its page showed.
type EventState struct {
	ID       uuid.UUID `json:"id"`
	Status   string    `json:"status"`
	Attempts int       `json:"attempts"`
	InFlight bool      `json:"in_flight"` // pending under a live relay lease (database clock)
	// LastError is ErrorDigest of the last error: whether it changed is
	// what a watcher needs, and the text (a broker's words, attacker data
	// at worst) then never leaves the page that escapes it.
	LastError   string     `json:"last_error"`
	PublishedAt *time.Time `json:"published_at"`
}

// StateOf is the watched state of an event as its detail page read it.
func StateOf(d EventDetail) EventState {
	return EventState{ID: d.ID, Status: d.Status, Attempts: d.Attempts, InFlight: d.InFlight,
		LastError: ErrorDigest(d.LastError), PublishedAt: d.PublishedAt}
}

// ErrorDigest is a short digest of a last error ("" for none), the same as
// EventStatesRead's SQL computes (md5 of the text, first 8 hex digits): it
// tells a changed error from the same one, nothing more.
func ErrorDigest(lastError *string) string {
	if lastError == nil {
		return ""
	}
	sum := md5.Sum([]byte(*lastError))
	return hex.EncodeToString(sum[:4])
}

// EventStatesRead reads the states of the events IDs names, by primary key,
// as one part of a composed statement (db.Read): the feed's one read of
// every watched event per tick. An id with no row (pruned) is absent from
// States. The caller bounds IDs (live.MaxWatched).
type EventStatesRead struct {
	IDs    []uuid.UUID
	States []EventState
}

// Expr implements db.Read.
func (r *EventStatesRead) Expr(args *db.Args) string {
	return `SELECT coalesce(json_agg(json_build_object('id', id, 'status', status, 'attempts', attempts,
	                                 'in_flight', coalesce(status = 'pending' AND locked_until > now(), false),
	                                 'last_error', coalesce(left(md5(last_error), 8), ''),
	                                 'published_at', published_at)), '[]')
	  FROM outbox_event WHERE id = ANY(` + args.Add(r.IDs) + `::uuid[])`
}

// Scan implements db.Read.
func (r *EventStatesRead) Scan(src []byte) error {
	r.States = nil
	if err := db.ScanJSON(src, &r.States); err != nil {
		return fmt.Errorf("outbox: watched events: %w", err)
	}
	return nil
}
