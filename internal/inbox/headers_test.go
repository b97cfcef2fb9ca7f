package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/brokertest"
	"github.com/sluice-dev/sluice/internal/broker/brokerurl"
	"github.com/sluice-dev/sluice/internal/broker/natsembedded"
	"github.com/sluice-dev/sluice/internal/broker/rabbitbroker"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/outbox/outboxtest"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// Events whose headers use names the system reserves, written straight
// into outbox_event by another writer (CONTRACT.md allows it; Insert
// refuses them), are each applied once. Until 7 December, on NATS, the
// reference consumer acknowledged an event carrying Sluice-Replay-To:
// billing without applying it (a replay for another consumer), and two
// events carrying Sluice-Event-Id: order-42 were deduplicated on that
// value, the second never applied.
func TestNATSEventsWithReservedHeaderNamesAreAppliedOnce(t *testing.T) {
	t.Parallel()
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	reservedHeaderNames(t, srv.ClientURL(), broker.Options{Namespace: brokertest.Namespace(t)})
}

// The same on RabbitMQ, where a producer's Sluice-Aggregate-Seq replaced the
// event's own and a CC header closed the relay's publishing channel.
func TestRabbitEventsWithReservedHeaderNamesAreAppliedOnce(t *testing.T) {
	t.Parallel()
	opts := broker.Options{Namespace: brokertest.Namespace(t)}
	r, err := rabbitbroker.Open(context.Background(), brokertest.RabbitURL, opts)
	if err != nil {
		t.Fatalf("RabbitMQ on 127.0.0.1:5672 (guest/guest) is needed: %v", err)
	}
	defer r.Close()
	if err := r.DeclareQueue("reference"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.DeleteNamespace("reference"); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	reservedHeaderNames(t, brokertest.RabbitURL, opts)
}

func reservedHeaderNames(t *testing.T, url string, opts broker.Options) {
	pool := dbtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	headers := []string{
		`{}`,
		`{"Sluice-Replay-To": "billing"}`,
		`{"Sluice-Event-Id": "order-42", "Sluice-Aggregate-Seq": "7"}`,
		`{"Sluice-Event-Id": "order-42", "CC": "elsewhere", "X-Other": "kept"}`,
	}
	for _, h := range headers {
		outboxtest.Insert(t, pool, outboxtest.Seed{Headers: h})
	}
	b, err := brokerurl.Open(ctx, url, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	relay, err := outbox.NewRelay(pool, b, outbox.RelayConfig{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := relay.RunOnce(ctx)
	if err != nil || res.Published != len(headers) {
		t.Fatalf("relay: %+v, %v; want all %d published", res, err, len(headers))
	}

	c := &inbox.Consumer{Inbox: inbox.New(pool), Name: "reference"}
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx, b) }()
	testkit.Until(t, "every event applied", func() bool {
		var unapplied int
		if err := pool.QueryRow(ctx, `
			SELECT count(*) FROM outbox_event e
			 WHERE NOT EXISTS (SELECT 1 FROM consume_effect c WHERE c.event_id = e.id::text AND c.aggregate_seq = e.aggregate_seq)`).Scan(&unapplied); err != nil {
			t.Fatal(err)
		}
		return unapplied == 0
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var effects int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM consume_effect`).Scan(&effects); err != nil {
		t.Fatal(err)
	}
	if n := c.Counts(); effects != len(headers) || n.Applied != int64(len(headers)) || n.Duplicates+n.Stale != 0 {
		t.Fatalf("%d effects, consumer counts %+v; want each of the %d events applied once", effects, n, len(headers))
	}
}
