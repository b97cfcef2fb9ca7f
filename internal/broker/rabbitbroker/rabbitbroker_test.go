package rabbitbroker_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/brokertest"
	"github.com/sluice-dev/sluice/internal/broker/rabbitbroker"
)

func openRabbit(t *testing.T, opts broker.Options) *rabbitbroker.RabbitMQ {
	t.Helper()
	conn, err := net.DialTimeout("tcp", "127.0.0.1:5672", 3*time.Second)
	if err != nil {
		t.Fatalf("RabbitMQ is not reachable on 127.0.0.1:5672 (%v): start it (e.g. `rabbitmq-server -detached`) or install it (`apt-get install -y rabbitmq-server`)", err)
	}
	conn.Close()
	if opts.Namespace == "" {
		opts.Namespace = brokertest.Namespace(t)
	}
	r, err := rabbitbroker.Open(context.Background(), brokertest.RabbitURL, opts)
	if err != nil {
		t.Fatalf("RabbitMQ on 127.0.0.1:5672 refused guest/guest: %v", err)
	}
	t.Cleanup(func() {
		if err := r.DeleteNamespace("reader"); err != nil {
			t.Logf("cleanup: %v", err)
		}
		r.Close()
	})
	return r
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	r := openRabbit(t, broker.Options{})
	// Declare the consumer's queue first: a publish nobody can receive is
	// refused (see TestRefusesUnroutable).
	if err := r.DeclareQueue("reader"); err != nil {
		t.Fatal(err)
	}
	brokertest.RoundTrip(t, r, brokertest.Messages(200, 7))
}

func TestRetriesAFailedEffectInPlace(t *testing.T) {
	t.Parallel()
	r := openRabbit(t, broker.Options{})
	if err := r.DeclareQueue("reader"); err != nil {
		t.Fatal(err)
	}
	brokertest.RetriesInPlace(t, r)
}

// With no queue bound, the broker confirms the publish but routes it
// nowhere; the publisher reports that instead of claiming success.
func TestRefusesUnroutable(t *testing.T) {
	t.Parallel()
	r := openRabbit(t, broker.Options{})
	err := r.Publish(context.Background(), brokertest.Messages(1, 1)[0])
	if !errors.Is(err, rabbitbroker.ErrUnroutable) {
		t.Fatalf("publish with no queue = %v, want ErrUnroutable", err)
	}
}

// A consumer that cannot consume says so: every failed attempt is logged
// with the wait before the next (growing), and after MaxConsumeFailures in a
// row Subscribe returns the broker's error instead of retrying in silence.
// The failure here is the broker refusing the queue's declaration, because
// a queue of that name already exists with other properties.
func TestSubscribeReportsConsumeFailures(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	r := openRabbit(t, broker.Options{
		MaxConsumeFailures: 3,
		Logger:             slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	conn, err := amqp.Dial(brokertest.RabbitURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// Not durable: Subscribe's durable declaration of the same name fails.
	if _, err := ch.QueueDeclare(r.Queue("reader"), false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	calls := 0
	err = r.Subscribe(ctx, "reader", func(context.Context, broker.Message) error {
		calls++
		return nil
	})
	if ctx.Err() != nil {
		t.Fatalf("Subscribe retried until the test's deadline: %v\n%s", err, logs.String())
	}
	var aerr *amqp.Error
	if !errors.As(err, &aerr) || aerr.Code != amqp.PreconditionFailed {
		t.Fatalf("Subscribe = %v, want the broker's PRECONDITION_FAILED", err)
	}
	if !strings.Contains(err.Error(), "3 times in a row") || calls != 0 {
		t.Fatalf("Subscribe = %v after %d handler calls, want 3 failures in a row and none", err, calls)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	want := []string{
		`level=WARN msg="broker: RabbitMQ consume failed, retrying" queue=` + r.Queue("reader") + ` failures=1 retry_in=500ms`,
		`level=WARN msg="broker: RabbitMQ consume failed, retrying" queue=` + r.Queue("reader") + ` failures=2 retry_in=1s`,
		`level=ERROR msg="broker: RabbitMQ consume failed, giving up" queue=` + r.Queue("reader") + ` failures=3`,
	}
	if len(lines) != len(want) {
		t.Fatalf("logged %d lines, want %d:\n%s", len(lines), len(want), logs.String())
	}
	for i, w := range want {
		if !strings.Contains(lines[i], w) || !strings.Contains(lines[i], "PRECONDITION_FAILED") {
			t.Fatalf("log line %d:\n%s\nwant it to contain\n%s\nand the broker's error", i, lines[i], w)
		}
	}
}

// A queue full with x-overflow reject-publish makes RabbitMQ nack the
// publish: the broker's refusal, not the message's failure, so the relay
// pauses (broker.ErrUnavailable) instead of spending the event's attempts
// until it dead-letters.
func TestNackOfAFullQueueIsUnavailable(t *testing.T) {
	t.Parallel()
	r := openRabbit(t, broker.Options{})
	conn, err := amqp.Dial(brokertest.RabbitURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	full := r.Exchange() + ".full"
	if _, err := ch.QueueDeclare(full, false, true, false, false, amqp.Table{"x-max-length": 1, "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = ch.QueueDelete(full, false, false, false) }()
	if err := ch.QueueBind(full, "#", r.Exchange(), false, nil); err != nil {
		t.Fatal(err)
	}
	msgs := brokertest.Messages(2, 2)
	if err := r.Publish(context.Background(), msgs[0]); err != nil {
		t.Fatalf("first publish into a queue with room: %v", err)
	}
	err = r.Publish(context.Background(), msgs[1])
	if !errors.Is(err, broker.ErrUnavailable) || !strings.Contains(err.Error(), "nack") {
		t.Fatalf("publish into a full reject-publish queue: %v, want ErrUnavailable (nack)", err)
	}
}
