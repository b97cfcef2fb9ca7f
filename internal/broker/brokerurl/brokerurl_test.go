package brokerurl_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/brokertest"
	"github.com/sluice-dev/sluice/internal/broker/brokerurl"
	"github.com/sluice-dev/sluice/internal/broker/natsbroker"
	"github.com/sluice-dev/sluice/internal/broker/natsembedded"
	"github.com/sluice-dev/sluice/internal/broker/rabbitbroker"
)

func TestOpenPicksTheAdapterByScheme(t *testing.T) {
	t.Parallel()
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	ctx := context.Background()
	ns := brokertest.Namespace(t)

	b, err := brokerurl.Open(ctx, srv.ClientURL(), broker.Options{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, ok := b.(*natsbroker.JetStream); !ok {
		t.Fatalf("Open(%s) = %T, want *natsbroker.JetStream", srv.ClientURL(), b)
	}

	r, err := brokerurl.Open(ctx, brokertest.RabbitURL, broker.Options{Namespace: ns})
	if err != nil {
		t.Fatalf("RabbitMQ on 127.0.0.1:5672 (guest/guest) is needed: %v", err)
	}
	defer r.Close()
	rabbit, ok := r.(*rabbitbroker.RabbitMQ)
	if !ok {
		t.Fatalf("Open(%s) = %T, want *rabbitbroker.RabbitMQ", brokertest.RabbitURL, r)
	}
	if err := rabbit.DeleteNamespace(); err != nil {
		t.Logf("cleanup: %v", err)
	}
}

func TestOpenRejectsUnknownSchemes(t *testing.T) {
	t.Parallel()
	b, err := brokerurl.Open(context.Background(), "kafka://127.0.0.1:9092", broker.Options{})
	if !errors.Is(err, brokerurl.ErrUnsupportedScheme) || b != nil {
		t.Fatalf("Open(kafka://) = %v, %v; want nil, ErrUnsupportedScheme", b, err)
	}
	b, err = brokerurl.Open(context.Background(), "nats://127.0.0.1:1", broker.Options{Namespace: "Bad Name"})
	if err == nil || b != nil {
		t.Fatalf("Open with an invalid namespace = %v, %v; want nil and an error", b, err)
	}
}
