package db_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// listeners returns the pids of the backends listening on channel.
func listeners(t *testing.T, pool *pgxpool.Pool, channel string) []int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND query = $1 AND pid <> pg_backend_pid()`,
		"LISTEN "+pgx.Identifier{channel}.Sanitize())
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

func wakeAfter(t *testing.T, l *db.Listener, poke func()) {
	t.Helper()
	// Drain the wake-up a (re)connect gives, then expect one for the poke.
	select {
	case <-l.Wake():
	default:
	}
	testkit.Until(t, "a wake-up after NOTIFY", func() bool {
		poke()
		select {
		case <-l.Wake():
			return true
		case <-time.After(50 * time.Millisecond):
			return false
		}
	})
}

// The listener survives its connection being killed: it reconnects, listens
// again and keeps waking its reader; Run returns once ctx ends, with its
// connection closed.
func TestListenerReconnectsAndStopsCleanly(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	channel := fmt.Sprintf("test_listen_%d", time.Now().UnixNano())
	l := db.NewListener(pool, channel, nil)
	l.MinBackoff, l.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()

	notify := func() {
		if _, err := pool.Exec(context.Background(), `SELECT pg_notify($1, '')`, channel); err != nil {
			t.Error(err)
		}
	}
	testkit.Until(t, "the listener's connection", func() bool { return len(listeners(t, pool, channel)) == 1 })
	first := listeners(t, pool, channel)[0]
	wakeAfter(t, l, notify)

	if _, err := pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, first); err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, "a new listening connection after the old one was killed", func() bool {
		p := listeners(t, pool, channel)
		return len(p) == 1 && p[0] != first
	})
	wakeAfter(t, l, notify)

	cancel()
	select {
	case <-done:
	case <-time.After(testkit.Deadline):
		t.Fatal("Run did not return after its context ended")
	}
	testkit.Until(t, "the listening connection to close", func() bool { return len(listeners(t, pool, channel)) == 0 })
}
