package inbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

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

// A row another writer put in the outbox with a header RabbitMQ cannot
// carry (a name over 255 bytes) fails alone: the relay publishes the rest
// of its batch, records that event's failure (backed off, dead-lettered in
// the end) and does not pause. Until 7 December the client closed the
// connection on that event's frame, every confirm in flight read as a nack
// ("a queue is full"): the whole batch was given back as an outage, the
// relay paused, and the events before it were already enqueued, to be sent
// again.
func TestRabbitAnEventOverAnAMQPLimitFailsAlone(t *testing.T) {
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
	pool := dbtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var poison uuid.UUID
	for i := range 6 {
		h := `{"X-Fine": "ok"}`
		if i == 2 {
			h = `{"` + strings.Repeat("k", 300) + `": "v"}`
		}
		if id := outboxtest.Insert(t, pool, outboxtest.Seed{Headers: h})[0]; i == 2 {
			poison = id
		}
	}
	relay, err := outbox.NewRelay(pool, r, outbox.RelayConfig{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := relay.RunOnce(ctx)
	if err != nil || res.Published != 5 || res.Failed != 1 || res.Unavailable != 0 || res.OutageRun != 0 {
		t.Fatalf("relay: %+v, %v; want 5 published, 1 failed, no outage", res, err)
	}
	var (
		status, lastError string
		attempts          int
	)
	if err := pool.QueryRow(ctx, `SELECT status, attempts, last_error FROM outbox_event WHERE id = $1`, poison).Scan(&status, &attempts, &lastError); err != nil {
		t.Fatal(err)
	}
	if status != outbox.StatusPending || attempts != 1 || !strings.Contains(lastError, "AMQP") {
		t.Fatalf("the event RabbitMQ cannot carry: %s after %d attempts, last error %q; want pending, backed off, the AMQP limit named", status, attempts, lastError)
	}
	conn, err := amqp.Dial(brokertest.RabbitURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive(r.Queue("reference"), true, false, false, false, nil)
	if err != nil || q.Messages != 5 {
		t.Fatalf("the queue holds %d messages (%v), want the 5 published ones", q.Messages, err)
	}
}
