package payments

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// published records what a relay published.
type published struct {
	mu    sync.Mutex
	types []string
}

func (p *published) Publish(_ context.Context, msg broker.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.types = append(p.types, msg.EventType)
	return nil
}

func (p *published) has(eventType string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range p.types {
		if t == eventType {
			return true
		}
	}
	return false
}

// A relay that polls once an hour publishes a payment's events as soon as
// they commit: the service pokes the notifier after each commit that wrote
// one (never inside the transaction), and the NOTIFY wakes the relay.
func TestPaymentEventsWakeAnIdleRelay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	n := outbox.NewNotifier(e.pool, 10*time.Millisecond, nil)
	e.svc.cfg.Poker = n
	e.account(1, "1000")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := &published{}
	r, err := outbox.NewRelay(e.pool, pub, outbox.RelayConfig{PollInterval: time.Hour}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(2)
	go func() { defer wg.Done(); _ = r.Run(ctx) }()
	go func() { defer wg.Done(); _ = n.Run(ctx) }()
	// The relay's first (empty) claim has run and its LISTEN is in effect:
	// from now on only a NOTIFY can make it claim again within the hour.
	testkit.Until(t, "the relay listening", func() bool {
		var listening bool
		_ = e.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database()
			AND state = 'idle' AND query IN ('LISTEN sluice_outbox', 'LISTEN "sluice_outbox"'))`).Scan(&listening)
		return listening && r.Stats().Claimed == 0
	})
	if a := e.post(newKey(), payBody("inv-poke", 1, "10")); a.status != 201 {
		t.Fatalf("payment: %d %s", a.status, a.body)
	}
	testkit.Until(t, "payment.requested and payment.completed published", func() bool {
		return pub.has(EventRequested) && pub.has(EventCompleted)
	})
}

// Without a Poker the service works the same; its events wait for a poll.
func TestServiceWithoutPoker(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "1000")
	if a := e.post(newKey(), payBody("inv-nopoke", 1, "10")); a.status != 201 {
		t.Fatalf("payment: %d %s", a.status, a.body)
	}
	if n := e.count(`SELECT count(*) FROM outbox_event WHERE status = 'pending'`); n != 2 {
		t.Fatalf("%d pending events, want payment.requested and payment.completed", n)
	}
}
