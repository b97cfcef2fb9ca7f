package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
)

// ErrNotFound reports an outbox event that does not exist (any more).
var ErrNotFound = errors.New("outbox: event not found")

// ErrConflict reports an operator action whose expectation is stale: the
// event is no longer in the state the operator saw (someone else acted
// first, or a relay did). errors.As to *ConflictError gives the current state.
var ErrConflict = errors.New("outbox: the event changed since it was read")

// ErrInvalidAction reports an action that cannot be asked for as given: a
// missing reason, or an expected state the action never applies to.
var ErrInvalidAction = errors.New("outbox: invalid action")

// Row is an outbox event as stored, for the console.
type Row struct {
	ID            uuid.UUID
	AggregateType string
	AggregateID   string
	AggregateSeq  int64
	Topic         string
	EventType     string
	Payload       json.RawMessage
	Headers       json.RawMessage
	Status        string
	CreatedAt     time.Time
	AvailableAt   time.Time
	LockedUntil   *time.Time
	Attempts      int
	LastError     *string
	PublishedAt   *time.Time
	DeadAt        *time.Time
	DeadReason    *string
	DiscardedAt   *time.Time
	DiscardReason *string
}

// InFlight reports whether a relay holds the event under a live lease at now.
func (r Row) InFlight(now time.Time) bool {
	return r.Status == StatusPending && r.LockedUntil != nil && r.LockedUntil.After(now)
}

const rowColumns = `id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, headers, status,
		       created_at, available_at, locked_until, attempts, last_error, published_at, dead_at, dead_reason,
		       discarded_at, discard_reason`

func (r *Row) scanTargets() []any {
	return []any{&r.ID, &r.AggregateType, &r.AggregateID, &r.AggregateSeq, &r.Topic, &r.EventType, &r.Payload, &r.Headers, &r.Status,
		&r.CreatedAt, &r.AvailableAt, &r.LockedUntil, &r.Attempts, &r.LastError, &r.PublishedAt, &r.DeadAt, &r.DeadReason,
		&r.DiscardedAt, &r.DiscardReason}
}

// Get reads one event.
func Get(ctx context.Context, q db.Querier, id uuid.UUID) (Row, error) {
	var r Row
	err := q.QueryRow(ctx, `SELECT `+rowColumns+` FROM outbox_event WHERE id = $1`, id).Scan(r.scanTargets()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, ErrNotFound
	}
	if err != nil {
		return Row{}, fmt.Errorf("outbox: get %s: %w", id, err)
	}
	return r, nil
}

// State is the part of an event an operator action changes: what the
// console writes as the audit row's before and after. It carries no payload,
// headers or error text (they may hold data; the trail carries none).
type State struct {
	Status        string    `json:"status"`
	InFlight      bool      `json:"in_flight"` // pending under a live relay lease (database clock)
	Attempts      int       `json:"attempts"`
	AvailableAt   time.Time `json:"available_at"`
	DeadReason    string    `json:"dead_reason,omitempty"`
	DiscardReason string    `json:"discard_reason,omitempty"`
	// DeadAt is when a dead event died. A retry clears it on the row, so
	// the retry's audit row (its before) is where the event page's
	// timeline still finds the death it undid.
	DeadAt *time.Time `json:"dead_at,omitempty"`
}

// Change is one operator action's effect on one event.
type Change struct {
	ID     uuid.UUID
	Before State
	After  State
}

// ConflictError is ErrConflict with what the caller expected and what is.
type ConflictError struct {
	ID       uuid.UUID
	Action   string // "retry", "discard", "dead-letter", "retry now"
	Expected string // the status the operator saw
	Current  State  // the event now
}

func (e *ConflictError) Error() string {
	now := e.Current.Status
	if e.Current.InFlight {
		now += " and in flight"
	}
	return fmt.Sprintf("outbox: cannot %s event %s: it is %s, not %s (someone else acted first)", e.Action, e.ID, now, e.Expected)
}

func (e *ConflictError) Unwrap() error { return ErrConflict }

// action is one operator action: the status it applies to and what it sets.
// Single actions (Retry, Discard, DeadLetter, RetryNow) and bulk jobs share
// these, so one event changes the same way whichever screen asked.
type action struct {
	name  string // for errors and ConflictError.Action
	from  string // the only status the action applies to
	set   string // SET clause; @reason is the operator's reason
	idle  bool   // also refused while a relay holds the event under a live lease
	needs bool   // a reason is required
}

var (
	// A retried dead event restarts its attempts at 0: it died of
	// MaxAttempts, so keeping the count would let one more failure kill it
	// again at once, with the longest backoff; the operator retries because
	// the cause is fixed, so it gets its full allowance. last_error stays as
	// history until the next attempt overwrites it; dead_at and dead_reason
	// describe a dead event and are cleared (the audit row keeps them). Its
	// aggregate_seq is unchanged, so it is still published before the
	// aggregate's later events, which it holds again as a pending event.
	actRetry = action{name: "retry", from: StatusDead,
		set: `status = 'pending', available_at = clock_timestamp(), attempts = 0,
		      locked_until = NULL, lock_token = NULL, dead_at = NULL, dead_reason = NULL`}
	// Discard keeps the dead history (dead_at, dead_reason, last_error)
	// beside the operator's reason.
	actDiscard = action{name: "discard", from: StatusDead, needs: true,
		set: `status = 'discarded', discarded_at = clock_timestamp(), discard_reason = @reason`}
	// An in-flight event may already be at the broker: dead-lettering it
	// under the relay would leave a published event marked dead (and a
	// duplicate on retry), so DeadLetter and RetryNow wait for the lease.
	actDeadLetter = action{name: "dead-letter", from: StatusPending, idle: true, needs: true,
		set: `status = 'dead', dead_at = clock_timestamp(), dead_reason = @reason, locked_until = NULL, lock_token = NULL`}
	actRetryNow = action{name: "retry now", from: StatusPending, idle: true,
		set: `available_at = clock_timestamp()`}
	// Replay makes a published event pending again, so the relays publish
	// it once more with its original id: the relay stays the only publisher
	// (a replay is leased, retried, backed off, ordered and paused like
	// any event, and counted in sluice_outbox_published_total again), and
	// no second broker connection lives in the console. Its aggregate_seq
	// is kept, so with ordering on it goes out before the aggregate's later
	// pending events. replay_to names the one consumer it is for;
	// replay_count makes each replay a new broker message (see
	// broker.Message.Replay). published_at keeps the last publish until the
	// relay marks it again; the audit trail keeps the job's chunks.
	actReplay = action{name: "replay", from: StatusPublished, needs: true,
		set: `status = 'pending', available_at = clock_timestamp(), attempts = 0, last_error = NULL,
		      locked_until = NULL, lock_token = NULL, replay_to = @replay_to,
		      replay_count = replay_count + 1, replayed_at = clock_timestamp()`}
)

// where is the action's compare-and-set condition on an outbox_event row.
func (a action) where() string {
	w := `status = @from`
	if a.idle {
		w += ` AND (locked_until IS NULL OR locked_until <= clock_timestamp())`
	}
	return w
}

func (a action) check(expected, reason string) error {
	if expected != a.from {
		return fmt.Errorf("%w: %s applies to %s events, not %q", ErrInvalidAction, a.name, a.from, expected)
	}
	if a.needs && reason == "" {
		return fmt.Errorf("%w: %s needs a reason", ErrInvalidAction, a.name)
	}
	return nil
}

const stateColumns = `status, coalesce(status = 'pending' AND locked_until > clock_timestamp(), false) AS in_flight,
	       attempts, available_at, coalesce(dead_reason, '') AS dead_reason, coalesce(discard_reason, '') AS discard_reason, dead_at`

// stateOf reads stateColumns back from an action's countedUpdate.
const stateOf = `u.status, u.in_flight, u.attempts, u.available_at, u.dead_reason, u.discard_reason, u.dead_at`

// updateSQL is an action's UPDATE of the rows in where (besides the action's
// own condition). It writes the backlog delta of the status it changes in
// the same statement (countedUpdate): an action is the only way the
// product moves an event between statuses besides the relay.
func (a action) updateSQL(where, returning string) string {
	return countedUpdate(`@from::text`, `UPDATE outbox_event SET `+a.set+` WHERE `+where+` AND `+a.where()+`
		RETURNING topic AS delta_topic, status AS delta_status, id, `+stateColumns, returning)
}

func (s *State) scanTargets() []any {
	return []any{&s.Status, &s.InFlight, &s.Attempts, &s.AvailableAt, &s.DeadReason, &s.DiscardReason, &s.DeadAt}
}

// act runs a on one event as compare-and-set on expected. The row is read
// FOR UPDATE first (the before of the audit row, and a lock that makes
// concurrent operators queue: the second one then sees the first one's
// result and gets a ConflictError); the UPDATE repeats the whole condition,
// so the action stays compare-and-set even on a pool, outside a transaction.
func act(ctx context.Context, q db.Querier, a action, id uuid.UUID, expected, reason string) (Change, error) {
	if err := a.check(expected, reason); err != nil {
		return Change{}, err
	}
	ch := Change{ID: id}
	err := q.QueryRow(ctx, `SELECT `+stateColumns+` FROM outbox_event WHERE id = $1 FOR UPDATE`, id).Scan(ch.Before.scanTargets()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return Change{}, ErrNotFound
	}
	if err != nil {
		return Change{}, fmt.Errorf("outbox: %s %s: read: %w", a.name, id, err)
	}
	if ch.Before.Status != expected || (a.idle && ch.Before.InFlight) {
		return Change{}, &ConflictError{ID: id, Action: a.name, Expected: expected, Current: ch.Before}
	}
	err = q.QueryRow(ctx, a.updateSQL(`id = @id`, stateOf),
		pgx.NamedArgs{"id": id, "from": a.from, "reason": reason}).Scan(ch.After.scanTargets()...)
	if errors.Is(err, pgx.ErrNoRows) {
		// Only without a transaction: someone acted between the two statements.
		var cur State
		err = q.QueryRow(ctx, `SELECT `+stateColumns+` FROM outbox_event WHERE id = $1`, id).Scan(cur.scanTargets()...)
		if errors.Is(err, pgx.ErrNoRows) {
			return Change{}, ErrNotFound
		}
		if err != nil {
			return Change{}, fmt.Errorf("outbox: %s %s: read: %w", a.name, id, err)
		}
		return Change{}, &ConflictError{ID: id, Action: a.name, Expected: expected, Current: cur}
	}
	if err != nil {
		return Change{}, fmt.Errorf("outbox: %s %s: %w", a.name, id, err)
	}
	return ch, nil
}

// The operator actions on one event. Each is compare-and-set on the status
// the operator saw (expected: Row.Status as the page showed it) and runs in
// q, which should be the transaction in which the console records the audit
// row, so action and audit commit together or not at all. A stale
// expectation returns a *ConflictError (errors.Is ErrConflict) carrying the
// event's current state, and changes nothing; a missing event returns
// ErrNotFound; an action that does not apply to expected, or lacks a
// required reason, returns ErrInvalidAction. The returned Change is the
// audit row's before and after.
//
// "In flight" is not a status but a pending event under a live relay lease
// (judged on the database clock). DeadLetter and RetryNow expect pending and
// refuse an in-flight event with a ConflictError whose Current.InFlight is
// true: the relay may already have handed it to the broker, and its lease
// token decides the event's fate; the operator tries again once the lease
// has ended (a lease lasts RelayConfig.Lease at most).

// Retry makes a dead event pending again, publishable now, with its attempts
// reset to 0 and its place in its aggregate's order kept.
func Retry(ctx context.Context, q db.Querier, id uuid.UUID, expected string) (Change, error) {
	return act(ctx, q, actRetry, id, expected, "")
}

// Discard gives up a dead event for good (status discarded, reason
// required): it is never published, and its aggregate's later events flow.
func Discard(ctx context.Context, q db.Querier, id uuid.UUID, expected, reason string) (Change, error) {
	return act(ctx, q, actDiscard, id, expected, reason)
}

// DeadLetter stops trying a pending event now (reason required): no relay
// publishes it until an operator retries it, and with ordering on it holds
// its aggregate's later events.
func DeadLetter(ctx context.Context, q db.Querier, id uuid.UUID, expected, reason string) (Change, error) {
	return act(ctx, q, actDeadLetter, id, expected, reason)
}

// RetryNow clears a pending event's backoff: it becomes available now
// (attempts are kept; it is still held while an earlier event of its
// aggregate is unfinished).
func RetryNow(ctx context.Context, q db.Querier, id uuid.UUID, expected string) (Change, error) {
	return act(ctx, q, actRetryNow, id, expected, "")
}

// Prune deletes published events whose published_at is older than
// now-retention, and discarded events whose discarded_at is, at most batch
// rows per statement (db.MaxDeleteBatch at most), until none are left. It
// never touches pending or dead events. It returns how many rows it deleted.
func Prune(ctx context.Context, q db.Querier, retention time.Duration, batch int, now time.Time) (int64, error) {
	if retention < 0 {
		return 0, fmt.Errorf("outbox: retention must not be negative (got %s)", retention)
	}
	// Oldest first along outbox_event_published_idx, then locked in id
	// order: every other locker of outbox rows (a job's chunk, an
	// operator's action) locks in id order, and a replayed event's
	// published_at runs against its id, so locking in published_at order
	// closed cycles with a replay job's chunk (a deadlock, one of the two
	// aborted). A row a replay moved back to pending meanwhile fails the
	// outer status check when the DELETE re-reads it, and stays.
	published, err := db.DeleteInBatches(ctx, q, "outbox: prune", `
		DELETE FROM outbox_event
		 WHERE id IN (SELECT id FROM outbox_event
		               WHERE id IN (SELECT id FROM outbox_event
		                             WHERE status = 'published' AND published_at < $1
		                             ORDER BY published_at
		                             LIMIT $2)
		               ORDER BY id
		               FOR UPDATE)
		   AND status = 'published'`, now.Add(-retention), batch)
	if err != nil {
		return published, err
	}
	// Discarded events are terminal too, and few: outbox_event_discarded_idx
	// holds only them, so each batch reads O(discarded) rows at most.
	// Locked in id order too (FOR UPDATE above the ORDER BY, not the
	// DELETE's join, decides the order).
	discarded, err := db.DeleteInBatches(ctx, q, "outbox: prune discarded", `
		DELETE FROM outbox_event
		 WHERE id IN (SELECT id FROM outbox_event
		               WHERE status = 'discarded' AND discarded_at < $1
		               ORDER BY id
		               LIMIT $2
		               FOR UPDATE)
		   AND status = 'discarded'`, now.Add(-retention), batch)
	return published + discarded, err
}
