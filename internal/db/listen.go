package db

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// OutboxChannel is the one LISTEN/NOTIFY channel of the product: a writer
// pokes it after committing outbox events (outbox.Notifier, rate-limited,
// never inside the business transaction), and relays and live feeds listen
// on it to wake before their next poll.
const OutboxChannel = "sluice_outbox"

// Listener holds one dedicated connection in LISTEN and turns notifications
// into coalesced wake-ups. A pooled connection cannot serve: LISTEN belongs
// to the session, which must stay open, so the listener dials its own
// connection with the pool's settings and never takes a pool slot.
//
// Notifications are only a hint: they are lost while the connection is down
// (and PostgreSQL drops them for a listener that lags too far), so every
// user keeps polling; the listener only shortens the wait.
type Listener struct {
	conn    *pgx.ConnConfig
	channel string
	log     *slog.Logger
	wake    chan struct{}
	// Reconnect backoff: doubles from MinBackoff to MaxBackoff while the
	// database stays unreachable, back to MinBackoff once LISTEN succeeds.
	MinBackoff, MaxBackoff time.Duration
}

// NewListener returns a listener on channel using pool's connection settings.
func NewListener(pool *pgxpool.Pool, channel string, log *slog.Logger) *Listener {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Listener{conn: pool.Config().ConnConfig.Copy(), channel: channel, log: log,
		wake: make(chan struct{}, 1), MinBackoff: 250 * time.Millisecond, MaxBackoff: 30 * time.Second}
}

// Wake receives one value after one or more notifications (coalesced: a
// reader that was busy finds one pending wake-up, not a queue).
func (l *Listener) Wake() <-chan struct{} { return l.wake }

// Run listens until ctx ends, reconnecting with backoff, and returns only
// then, so a caller that waits for Run knows the connection is closed.
func (l *Listener) Run(ctx context.Context) {
	backoff := l.MinBackoff
	for ctx.Err() == nil {
		listening, err := l.once(ctx)
		if ctx.Err() != nil {
			return
		}
		if listening {
			backoff = l.MinBackoff
		}
		l.log.Warn("LISTEN connection lost; polling continues until it is back", "channel", l.channel, "err", err, "retry_in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, l.MaxBackoff)
	}
}

// once runs one connection's life; listening reports whether LISTEN took.
func (l *Listener) once(ctx context.Context) (listening bool, err error) {
	conn, err := pgx.ConnectConfig(ctx, l.conn)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.channel}.Sanitize()); err != nil {
		return false, err
	}
	// A notification sent while we were reconnecting is lost: wake the
	// reader once so it does not wait a whole poll for work already there.
	l.signal()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return true, err
		}
		l.signal()
	}
}

func (l *Listener) signal() {
	select {
	case l.wake <- struct{}{}:
	default: // a wake-up is already pending
	}
}
