package outbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/sluice-dev/sluice/internal/db"
)

// Notifier wakes sleeping relays after writers commit events, sending at
// most one NOTIFY per interval however many events are written.
//
// Why not NOTIFY inside the writer's transaction (or from a trigger)?
// PostgreSQL serializes the commits of all transactions that issued NOTIFY on
// one global lock on the notification queue, so a NOTIFY per event would make
// every business commit wait in line. Instead writers call Poke after their
// transaction committed; Poke only sets a flag, and one goroutine sends a
// single autocommit pg_notify per interval, outside every business
// transaction. A lost wake-up (crash, listener reconnecting) costs at most the
// relay's poll interval: polling is the fallback.
type Notifier struct {
	q        db.Querier
	interval time.Duration
	log      *slog.Logger
	poke     chan struct{}
}

// DefaultNotifyInterval is the shortest time between two NOTIFYs. It bounds
// how long a sleeping relay may miss events committed just after a NOTIFY:
// at 50 ms, R2's commit→publish p99 at 1,000 events/s was 40–48 ms, nearly
// all of it this wait (bench/README.md). At 5 ms the notifier sends at most
// 200 NOTIFYs a second, each an asynchronous commit on its own connection.
const DefaultNotifyInterval = 5 * time.Millisecond

// NewNotifier builds a notifier sending on db.OutboxChannel through q at most
// once per interval (default DefaultNotifyInterval). Start it with Run.
func NewNotifier(q db.Querier, interval time.Duration, log *slog.Logger) *Notifier {
	if interval <= 0 {
		interval = DefaultNotifyInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Notifier{q: q, interval: interval, log: log, poke: make(chan struct{}, 1)}
}

// Poke asks for a wake-up; it never blocks and never touches the database.
// Call it after the transaction that inserted events has committed.
func (n *Notifier) Poke() {
	select {
	case n.poke <- struct{}{}:
	default: // already asked; pokes coalesce
	}
}

// notifySQL sends one notification. NOTIFY gives its transaction an xid, so
// it commits like a write, and PostgreSQL holds its global notify lock until
// the commit is done: committing asynchronously (this transaction only) takes
// the WAL flush out of both. A notification lost in a server crash costs a
// relay one poll interval, as any lost wake-up does; it is never a lost event.
const notifySQL = `SELECT pg_notify($1, '') FROM (SELECT set_config('synchronous_commit', 'off', true)) async_commit`

// Run sends the coalesced notifications until ctx ends.
func (n *Notifier) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.poke:
		}
		if _, err := n.q.Exec(ctx, notifySQL, db.OutboxChannel); err != nil && ctx.Err() == nil {
			n.log.Warn("outbox: notify failed; relays will poll", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(n.interval):
		}
	}
}
