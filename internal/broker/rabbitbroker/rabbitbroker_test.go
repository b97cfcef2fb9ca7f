package rabbitbroker_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

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
