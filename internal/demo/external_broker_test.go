package demo

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/brokertest"
	"github.com/sluice-dev/sluice/internal/broker/natsembedded"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// On a broker it does not own (--broker-url), the demo works in a namespace
// of its own and deletes it when it stops: in the shared default namespace
// a second run's consumer read the first run's leftover messages, whose
// order ids start at 1 again, and its inbox dropped the new run's own
// events as stale. The relays publish in batches there, as in production.
func TestDemoOnAnExternalBrokerLeavesNothingThere(t *testing.T) {
	t.Parallel()
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	for name, c := range map[string]struct {
		url  string
		gone func(t *testing.T, ns string) error // nil: the namespace is gone
	}{
		"NATS JetStream": {srv.ClientURL(), func(t *testing.T, ns string) error {
			nc, err := nats.Connect(srv.ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			stream := strings.ToUpper(strings.ReplaceAll(ns, "-", "_"))
			if _, err := js.Stream(context.Background(), stream); !errors.Is(err, jetstream.ErrStreamNotFound) {
				return errors.New("the stream " + stream + " is still there")
			}
			return nil
		}},
		"RabbitMQ": {brokertest.RabbitURL, func(t *testing.T, ns string) error {
			conn, err := amqp.Dial(brokertest.RabbitURL)
			if err != nil {
				t.Fatalf("RabbitMQ at %s: %v (the machine's RabbitMQ must run for this test)", brokertest.RabbitURL, err)
			}
			defer conn.Close()
			for _, check := range []func(ch *amqp.Channel) error{
				func(ch *amqp.Channel) error {
					return ch.ExchangeDeclarePassive(ns, "topic", true, false, false, false, nil)
				},
				func(ch *amqp.Channel) error {
					_, err := ch.QueueDeclarePassive(ns+"."+consumerName, true, false, false, false, nil)
					return err
				},
			} {
				ch, err := conn.Channel()
				if err != nil {
					t.Fatal(err)
				}
				var ae *amqp.Error
				if err := check(ch); !errors.As(err, &ae) || ae.Code != amqp.NotFound {
					return errors.New("the exchange or the consumer's queue of " + ns + " is still there")
				}
			}
			return nil
		}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var cfg config.Demo
			f := config.NewFlags("demo", "", config.MapLookup(nil), &bytes.Buffer{})
			cfg.Register(f)
			if err := f.Parse([]string{"--database-url", dbtest.URL(t), "--broker-url", c.url,
				"--console-addr", "127.0.0.1:0", "--payments-addr", "127.0.0.1:0", "--provider-addr", "127.0.0.1:0",
				"--event-rate", "100", "--status-every", "200ms"}); err != nil {
				t.Fatal(err)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			var out testkit.Buffer
			d, err := Start(context.Background(), cfg, &out, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			ns := d.namespace
			if !strings.HasPrefix(ns, "sluice-demo-") || !strings.Contains(out.String(), "namespace "+ns) {
				t.Errorf("namespace %q, output:\n%s", ns, out.String())
			}
			if _, batch := newPoisonPublisher(d.brokers[0]).(broker.BatchPublisher); !batch {
				t.Errorf("the relays' publisher hides the %s adapter's batches: they publish one message at a time", name)
			}
			testkit.Eventually(t, "the consumer to apply 50 events", func() (bool, error) { return d.consumer.Counts().Applied >= 50, nil })
			if err := d.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for err := c.gone(t, ns); err != nil; err = c.gone(t, ns) {
				if time.Now().After(deadline) {
					t.Fatal(err)
				}
				time.Sleep(200 * time.Millisecond)
			}
		})
	}
}

// batchRecorder is a BatchPublisher that records what it was given.
type batchRecorder struct{ got []string }

func (b *batchRecorder) Publish(context.Context, broker.Message) error {
	return errors.New("Publish called")
}
func (b *batchRecorder) PublishBatch(_ context.Context, msgs []broker.Message) []error {
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		b.got = append(b.got, m.ID)
		if m.ID == "broken" {
			errs[i] = broker.ErrUnavailable
		}
	}
	return errs
}

// The demo's refusing publisher keeps the batch path: malformed payloads
// fail on their own, the others go to the broker in one batch with their
// own outcomes, each in its place.
func TestPoisonBatchPublisher(t *testing.T) {
	t.Parallel()
	rec := &batchRecorder{}
	p, ok := newPoisonPublisher(rec).(broker.BatchPublisher)
	if !ok {
		t.Fatal("not a BatchPublisher")
	}
	msgs := []broker.Message{{ID: "a", Payload: []byte(`{}`)}, {ID: "bad", Payload: []byte(`{"malformed":true}`)},
		{ID: "broken", Payload: []byte(`{}`)}, {ID: "c", Payload: []byte(`{"malformed":false}`)}}
	errs := p.PublishBatch(context.Background(), msgs)
	if strings.Join(rec.got, ",") != "a,broken,c" {
		t.Errorf("sent %v, want a,broken,c", rec.got)
	}
	if errs[0] != nil || !errors.Is(errs[1], errRefusedPayload) || !errors.Is(errs[2], broker.ErrUnavailable) || errs[3] != nil {
		t.Errorf("outcomes %v", errs)
	}
}
