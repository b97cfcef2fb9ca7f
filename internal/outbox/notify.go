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

// NewNotifier builds a notifier sending on db.OutboxChannel through q at most
// once per interval (default 50ms). Start it with Run.
func NewNotifier(q db.Querier, interval time.Duration, log *slog.Logger) *Notifier {
	if interval <= 0 {
		interval = 50 * time.Millisecond
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

// Run sends the coalesced notifications until ctx ends.
func (n *Notifier) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.poke:
		}
		if _, err := n.q.Exec(ctx, `SELECT pg_notify($1, '')`, db.OutboxChannel); err != nil && ctx.Err() == nil {
			n.log.Warn("outbox: notify failed; relays will poll", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(n.interval):
		}
	}
}
