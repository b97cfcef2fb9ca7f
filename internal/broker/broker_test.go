package broker_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/broker"
)

// RabbitURL is the RabbitMQ server these tests use (present on this kind of
// machine; see ECOSYSTEM.md). Its absence is a failure, never a skip.
const RabbitURL = "amqp://guest:guest@127.0.0.1:5672/"

// namespace gives each test its own stream / exchange / queues.
func namespace(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "t" + hex.EncodeToString(b)
}

func startNATS(t *testing.T) *broker.EmbeddedNATS {
	t.Helper()
	srv, err := broker.StartEmbeddedNATS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

func messages(n int, aggregates int) []broker.Message {
	var out []broker.Message
	seq := map[int]int64{}
	for i := range n {
		a := i % aggregates
		seq[a]++
		out = append(out, broker.Message{
			ID: fmt.Sprintf("id-%04d", i), Topic: "payment.completed",
			AggregateType: "payment", AggregateID: "p-" + strconv.Itoa(a), AggregateSeq: seq[a],
			EventType: "payment.completed.v1", Payload: []byte(fmt.Sprintf(`{"n":%d}`, i)),
			Headers: map[string]string{"Trace-Id": "tr-" + strconv.Itoa(i)},
		})
	}
	return out
}

// roundTrip publishes msgs, then reads them back through Subscribe and
// checks every field survived and the order is the publish order.
func roundTrip(t *testing.T, b broker.Broker, msgs []broker.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, m := range msgs {
		if err := b.Publish(ctx, m); err != nil {
			t.Fatalf("publish %s: %v", m.ID, err)
		}
	}
	var (
		mu  sync.Mutex
		got []broker.Message
	)
	subCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- b.Subscribe(subCtx, "reader", func(_ context.Context, m broker.Message) error {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, m)
			if len(got) == len(msgs) {
				stop()
			}
			return nil
		})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("subscribe: %v", err)
		}
	case <-ctx.Done():
		t.Fatalf("received %d of %d messages before the deadline", len(got), len(msgs))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != len(msgs) {
		t.Fatalf("received %d messages, want %d", len(got), len(msgs))
	}
	for i, m := range msgs {
		g := got[i]
		if g.ID != m.ID || g.Topic != m.Topic || g.AggregateType != m.AggregateType || g.AggregateID != m.AggregateID ||
			g.AggregateSeq != m.AggregateSeq || g.EventType != m.EventType || string(g.Payload) != string(m.Payload) ||
			g.Headers["Trace-Id"] != m.Headers["Trace-Id"] {
			t.Fatalf("message %d: got %+v, want %+v", i, g, m)
		}
	}
}

func TestNATSRoundTrip(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	ns := namespace(t)
	b, err := broker.Open(context.Background(), srv.ClientURL(), broker.Options{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	roundTrip(t, b, messages(200, 7))
}

// The event id is the Nats-Msg-Id: a relay republishing an id (after a crash
// before its mark) does not store it twice within the duplicate window.
func TestNATSDeduplicatesByEventID(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	ns := namespace(t)
	ctx := context.Background()
	b, err := broker.OpenNATS(ctx, srv.ClientURL(), broker.Options{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	m := messages(1, 1)[0]
	for range 3 {
		if err := b.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	st, err := js.Stream(ctx, b.Stream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("stream holds %d messages after 3 publishes of one id, want 1", info.State.Msgs)
	}
	msg, err := st.GetLastMsgForSubject(ctx, b.Subject(m.Topic))
	if err != nil {
		t.Fatal(err)
	}
	if msg.Header.Get(jetstream.MsgIDHeader) != m.ID || msg.Header.Get(broker.HeaderAggregateID) != m.AggregateID {
		t.Fatalf("stored headers %v", msg.Header)
	}
}

// A failed effect is retried on the same message before the next one is
// read, so a consumer never moves past an event it could not apply.
func retriesInPlace(t *testing.T, b broker.Broker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	msgs := messages(2, 1)
	for _, m := range msgs {
		if err := b.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	var calls []string
	subCtx, stop := context.WithCancel(ctx)
	err := b.Subscribe(subCtx, "reader", func(_ context.Context, m broker.Message) error {
		calls = append(calls, m.ID)
		if len(calls) <= 2 {
			return errors.New("effect failed")
		}
		if m.ID == msgs[1].ID {
			stop()
		}
		return nil
	})
	want := []string{msgs[0].ID, msgs[0].ID, msgs[0].ID, msgs[1].ID}
	if err != nil || fmt.Sprint(calls) != fmt.Sprint(want) {
		t.Fatalf("Subscribe = %v, handler calls %v; want %v", err, calls, want)
	}
}

func TestNATSRetriesAFailedEffectInPlace(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	b, err := broker.Open(context.Background(), srv.ClientURL(), broker.Options{Namespace: namespace(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	retriesInPlace(t, b)
}

func TestRabbitRetriesAFailedEffectInPlace(t *testing.T) {
	t.Parallel()
	r := openRabbit(t)
	if err := r.DeclareQueue("reader"); err != nil {
		t.Fatal(err)
	}
	retriesInPlace(t, r)
}

func openRabbit(t *testing.T) *broker.Rabbit {
	t.Helper()
	conn, err := net.DialTimeout("tcp", "127.0.0.1:5672", 3*time.Second)
	if err != nil {
		t.Fatalf("RabbitMQ is not reachable on 127.0.0.1:5672 (%v): start it (e.g. `rabbitmq-server -detached`) or install it (`apt-get install -y rabbitmq-server`)", err)
	}
	conn.Close()
	r, err := broker.OpenRabbit(context.Background(), RabbitURL, broker.Options{Namespace: namespace(t)})
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

func TestRabbitRoundTrip(t *testing.T) {
	t.Parallel()
	r := openRabbit(t)
	// Declare the consumer's queue first: a publish nobody can receive is
	// refused (see TestRabbitRefusesUnroutable).
	if err := r.DeclareQueue("reader"); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, r, messages(200, 7))
}

// With no queue bound, the broker confirms the publish but routes it
// nowhere; the publisher reports that instead of claiming success.
func TestRabbitRefusesUnroutable(t *testing.T) {
	t.Parallel()
	r := openRabbit(t)
	err := r.Publish(context.Background(), messages(1, 1)[0])
	if !errors.Is(err, broker.ErrUnroutable) {
		t.Fatalf("publish with no queue = %v, want ErrUnroutable", err)
	}
}

func TestOpenRejectsUnknownSchemes(t *testing.T) {
	t.Parallel()
	if _, err := broker.Open(context.Background(), "kafka://127.0.0.1:9092", broker.Options{}); !errors.Is(err, broker.ErrUnsupportedScheme) {
		t.Fatalf("Open(kafka://) = %v, want ErrUnsupportedScheme", err)
	}
	if _, err := broker.Open(context.Background(), "nats://127.0.0.1:1", broker.Options{Namespace: "Bad Name"}); err == nil {
		t.Fatal("an invalid namespace was accepted")
	}
}

// A consumer that dies holding delivered but unacknowledged messages (a
// crash, a cut connection) must not let its successor run ahead of them: the
// successor would apply later events of an aggregate first, and the inbox
// would then drop the redelivered earlier ones as stale, losing their
// effects. JetStream therefore keeps one message in flight per consumer, and
// the successor sees every sequence in order.
func TestNATSConsumerCrashKeepsOrder(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	opts := broker.Options{Namespace: namespace(t), AckWait: 2 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pub, err := broker.Open(ctx, srv.ClientURL(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	msgs := messages(300, 1) // one aggregate: sequences 1..300
	for _, m := range msgs {
		if err := pub.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}

	// The first consumer applies sequence 1, then hangs on 2 and dies.
	first, err := broker.Open(ctx, srv.ClientURL(), opts)
	if err != nil {
		t.Fatal(err)
	}
	firstCtx, kill := context.WithCancel(ctx)
	hung := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- first.Subscribe(firstCtx, "reader", func(ctx context.Context, m broker.Message) error {
			if m.AggregateSeq == 1 {
				return nil
			}
			close(hung)
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	select {
	case <-hung:
	case <-ctx.Done():
		t.Fatal("the first consumer never got sequence 2")
	}
	// The pull that brought sequence 2 asked for more: whatever the server
	// handed this client with it is what a successor could overtake.
	_ = first.Close()
	kill()
	<-done

	second, err := broker.Open(ctx, srv.ClientURL(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	var got []int64
	secondCtx, stop := context.WithCancel(ctx)
	err = second.Subscribe(secondCtx, "reader", func(_ context.Context, m broker.Message) error {
		got = append(got, m.AggregateSeq)
		if len(got) == len(msgs)-1 {
			stop()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(msgs)-1 {
		t.Fatalf("the successor received %d messages, want %d", len(got), len(msgs)-1)
	}
	for i, seq := range got {
		if seq != int64(i+2) {
			t.Fatalf("the successor's message %d has sequence %d, want %d (order lost after a crash): %v", i, seq, i+2, got[:min(len(got), i+5)])
		}
	}
}

// A publish while the NATS server is gone fails as broker.ErrUnavailable (so
// the relay backs off without spending the event's attempts), and the same
// client publishes again once a server is back on the port and folder.
func TestNATSPublishDuringOutageIsUnavailable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv, err := broker.StartEmbeddedNATS(dir)
	if err != nil {
		t.Fatal(err)
	}
	port := srv.Port()
	ctx := context.Background()
	b, err := broker.Open(ctx, srv.ClientURL(), broker.Options{Namespace: namespace(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	msgs := messages(2, 1)
	if err := b.Publish(ctx, msgs[0]); err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	err = b.Publish(pctx, msgs[1])
	cancel()
	if !errors.Is(err, broker.ErrUnavailable) {
		t.Fatalf("publish with the server down: %v, want ErrUnavailable", err)
	}
	srv, err = broker.StartEmbeddedNATSAt(dir, port)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	deadline := time.Now().Add(30 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := b.Publish(pctx, msgs[1])
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no publish after the restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
