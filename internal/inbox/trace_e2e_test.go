package inbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/brokerurl"
	"github.com/sluice-dev/sluice/internal/broker/natsembedded"
	"github.com/sluice-dev/sluice/internal/broker/rabbitbroker"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// The caller's W3C trace context, as a request would bring it.
const (
	callerTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerParentID    = "00f067aa0ba902b7"
	callerTraceparent = "00-" + callerTraceID + "-" + callerParentID + "-01"
	callerTracestate  = "vendor=opaque"
)

func callerContext() context.Context {
	return propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{"traceparent": callerTraceparent, "tracestate": callerTracestate})
}

// A traceparent on the context that inserts an event travels through the
// real relay, embedded NATS JetStream and the real inbox consumer: the
// relay's publish span is a child of the caller's span, and the consumer's
// span a child of the publish span, all in the caller's trace.
func TestTraceContextCrossesTheOutboxOverNATS(t *testing.T) {
	t.Parallel()
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	traceAcross(t, srv.ClientURL(), broker.Options{Namespace: "trace"}, true, 0)
}

// Without tracing (no provider: the default), the stored traceparent and
// tracestate still reach the consumer as they were written, on NATS…
func TestTraceHeadersSurviveTheRelayOverNATS(t *testing.T) {
	t.Parallel()
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	traceAcross(t, srv.ClientURL(), broker.Options{Namespace: "traceoff"}, false, 0)
}

// …and on the RabbitMQ server on this machine (absent: a failure naming
// it, never a skip), with tracing on.
func TestTraceContextCrossesTheOutboxOverRabbitMQ(t *testing.T) {
	t.Parallel()
	const url = "amqp://guest:guest@127.0.0.1:5672/"
	opts := broker.Options{Namespace: fmt.Sprintf("trace-%d", time.Now().UnixNano())}
	r, err := rabbitbroker.Open(context.Background(), url, opts)
	if err != nil {
		t.Fatalf("RabbitMQ on 127.0.0.1:5672 (guest/guest) is needed: %v", err)
	}
	defer r.Close()
	if err := r.DeclareQueue("traced"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.DeleteNamespace("traced"); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	traceAcross(t, url, opts, true, 0)
}

// The sharded consumer (console consume --shards) continues the trace the
// same way: one span per message of its batch.
func TestTraceContextCrossesTheOutboxToTheShardedConsumer(t *testing.T) {
	t.Parallel()
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	traceAcross(t, srv.ClientURL(), broker.Options{Namespace: "traceshard"}, true, 4)
}

// traceAcross inserts one traced event, relays it and consumes it: with the
// reference consumer (shards 0) or the sharded one on that many shards.
func traceAcross(t *testing.T, url string, opts broker.Options, traced bool, shards int) {
	pool := dbtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	var provider trace.TracerProvider
	if traced {
		provider = tp
	}

	var ins outbox.Inserted
	err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		var err error
		ins, err = outbox.Insert(callerContext(), tx, outbox.Event{AggregateType: "order", AggregateID: "o-1",
			Topic: "orders", EventType: "order.placed.v1", Payload: []byte(`{}`)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var stored map[string]string
	if err := pool.QueryRow(ctx, `SELECT headers FROM outbox_event WHERE id = $1`, ins.ID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored["traceparent"] != callerTraceparent || stored["tracestate"] != callerTracestate {
		t.Fatalf("stored headers %v, want the caller's traceparent and tracestate", stored)
	}

	pub, err := brokerurl.Open(ctx, url, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	sub, err := brokerurl.Open(ctx, url, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	var (
		mu   sync.Mutex
		seen map[string]string
	)
	effect := func(ctx context.Context, tx pgx.Tx, msg broker.Message) error {
		mu.Lock()
		seen = msg.Headers
		mu.Unlock()
		return inbox.RecordEffect("traced")(ctx, tx, msg)
	}
	run := (&inbox.Consumer{Inbox: inbox.New(pool), Name: "traced", Tracing: provider, Effect: effect}).Run
	if shards > 0 {
		ss, ok := sub.(broker.ShardSubscriber)
		if !ok {
			t.Fatalf("%T cannot read shards", sub)
		}
		sc := &inbox.ShardedConsumer{Inbox: inbox.New(pool), Name: "traced", Shards: shards, Tracing: provider,
			Effect: inbox.EachEffect(effect), RetryInterval: 100 * time.Millisecond}
		run = func(ctx context.Context, _ broker.Subscriber) error { return sc.Run(ctx, ss) }
	}
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(cctx, sub) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	}()

	relay, err := outbox.NewRelay(pool, pub, outbox.RelayConfig{DisableListen: true, Tracing: provider, Shards: shards}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the relay to publish the event", func() (bool, error) {
		res, err := relay.RunOnce(ctx)
		return res.Published == 1, err
	})
	testkit.Eventually(t, "the consumer to apply the event", func() (bool, error) {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM consume_effect WHERE event_id = $1`, ins.ID.String()).Scan(&n)
		return n == 1, err
	})
	mu.Lock()
	got := seen
	mu.Unlock()
	if got["tracestate"] != callerTracestate {
		t.Errorf("delivered tracestate %q, want %q", got["tracestate"], callerTracestate)
	}
	if !traced {
		if got["traceparent"] != callerTraceparent {
			t.Errorf("delivered traceparent %q, want the stored %q", got["traceparent"], callerTraceparent)
		}
		if n := len(exp.GetSpans()); n != 0 {
			t.Errorf("%d spans recorded with tracing off", n)
		}
		return
	}

	// The consumer's span ends once its transaction has committed, a moment
	// after the effect's row is visible: wait for it to be recorded.
	var publish, handle *tracetest.SpanStub
	testkit.Eventually(t, "a publish and a handle span", func() (bool, error) {
		publish, handle = nil, nil
		spans := exp.GetSpans()
		for i := range spans {
			switch spans[i].Name {
			case "publish orders":
				publish = &spans[i]
			case "handle orders":
				handle = &spans[i]
			}
		}
		if publish == nil || handle == nil {
			return false, fmt.Errorf("spans %v", spanNames(spans))
		}
		return true, nil
	})
	if id := publish.SpanContext.TraceID().String(); id != callerTraceID {
		t.Errorf("publish span in trace %s, want the caller's %s", id, callerTraceID)
	}
	if p := publish.Parent.SpanID().String(); p != callerParentID || !publish.Parent.IsRemote() {
		t.Errorf("publish span's parent %s (remote %v), want the caller's %s", p, publish.Parent.IsRemote(), callerParentID)
	}
	if publish.SpanKind != trace.SpanKindProducer || handle.SpanKind != trace.SpanKindConsumer {
		t.Errorf("span kinds %v and %v", publish.SpanKind, handle.SpanKind)
	}
	if id := handle.SpanContext.TraceID().String(); id != callerTraceID {
		t.Errorf("consumer span in trace %s, want the caller's %s", id, callerTraceID)
	}
	if handle.Parent.SpanID() != publish.SpanContext.SpanID() || !handle.Parent.IsRemote() {
		t.Errorf("consumer span's parent %s, want the publish span %s", handle.Parent.SpanID(), publish.SpanContext.SpanID())
	}
	want := "00-" + callerTraceID + "-" + publish.SpanContext.SpanID().String() + "-01"
	if got["traceparent"] != want {
		t.Errorf("delivered traceparent %q, want the publish span's %q", got["traceparent"], want)
	}
}

func spanNames(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}
