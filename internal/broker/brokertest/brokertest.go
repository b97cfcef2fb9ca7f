// Package brokertest holds what every adapter's tests share: a namespace of
// their own per test, ordered messages over a few aggregates, and the checks
// each adapter must pass (RoundTrip, RetriesInPlace), and a RabbitMQ node
// of a test's own (StartRabbitNode).
package brokertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/broker"
)

// RabbitURL is the RabbitMQ server the tests use (present on this kind of
// machine; see ECOSYSTEM.md). Its absence is a failure, never a skip.
const RabbitURL = "amqp://guest:guest@127.0.0.1:5672/"

// Namespace gives each test its own stream / exchange / queues.
func Namespace(t testing.TB) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "t" + hex.EncodeToString(b)
}

// Messages is n messages over the given number of aggregates, each
// aggregate's sequence counting from 1, with a payload and an extra header.
func Messages(n int, aggregates int) []broker.Message {
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

// RoundTrip publishes msgs, then reads them back through Subscribe (consumer
// "reader") and checks every field survived, no other header was added, and
// the order is the publish order.
func RoundTrip(t *testing.T, b broker.Broker, msgs []broker.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, m := range msgs {
		if err := b.Publish(ctx, m); err != nil {
			t.Fatalf("publish %s: %v", m.ID, err)
		}
	}
	got := readBack(ctx, t, b, len(msgs))
	for i, m := range msgs {
		if g := got[i]; !same(g, m) {
			t.Fatalf("message %d: got %+v, want %+v", i, g, m)
		}
	}
}

// same says whether got carries every field of want a subscriber reads.
func same(got, want broker.Message) bool {
	return got.ID == want.ID && got.Topic == want.Topic && got.AggregateType == want.AggregateType && got.AggregateID == want.AggregateID &&
		got.AggregateSeq == want.AggregateSeq && got.EventType == want.EventType && string(got.Payload) == string(want.Payload) &&
		fmt.Sprint(got.Headers) == fmt.Sprint(want.Headers) && got.ReplayTo == want.ReplayTo &&
		got.Shards == want.Shards && got.Shard == want.Shard
}

// readBack reads n messages through Subscribe (consumer "reader").
func readBack(ctx context.Context, t *testing.T, b broker.Broker, n int) []broker.Message {
	t.Helper()
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
			if len(got) == n {
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
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("received %d of %d messages before the deadline", len(got), n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != n {
		t.Fatalf("received %d messages, want %d", len(got), n)
	}
	return got
}

// ForgedHeaders are producer headers under names the system reserves
// (broker.ReservedHeader), as a row another writer put straight into
// outbox_event may carry, and one of the producer's own ("X-Kept").
func ForgedHeaders() map[string]string {
	return map[string]string{
		broker.HeaderEventID:      "order-42",     // two events with one value were deduplicated as one (NATS)
		broker.HeaderReplayTo:     "billing",      // every other consumer acknowledged the event unapplied (NATS)
		"sluice-replay-to":        "billing",      // in any case
		broker.HeaderAggregateSeq: "99",           // replaced the event's own (RabbitMQ)
		broker.HeaderAggregateID:  "someone-else", // as above
		broker.HeaderEventType:    "forged.v1",
		broker.HeaderShard:        "1/2",
		"Sluice-Topic":            "elsewhere", // RabbitMQ's own
		"Nats-Expected-Stream":    "ANOTHER",   // JetStream refused the publish
		"CC":                      "elsewhere", // RabbitMQ closed the publishing channel
		"X-Kept":                  "the producer's own",
	}
}

// ProducerHeadersCannotPassForTheSystems publishes two events of one
// aggregate carrying ForgedHeaders and reads them back through Subscribe
// (consumer "reader"): each arrives with its own id, aggregate, sequence,
// type and topic, for every consumer, and with only the producer's header
// that the system does not reserve.
func ProducerHeadersCannotPassForTheSystems(t *testing.T, b broker.Broker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	msgs := Messages(2, 1)
	for i := range msgs {
		msgs[i].Headers = ForgedHeaders()
		if err := b.Publish(ctx, msgs[i]); err != nil {
			t.Fatalf("publish %s with reserved header names among its producer headers: %v", msgs[i].ID, err)
		}
	}
	got := readBack(ctx, t, b, len(msgs))
	for i, m := range msgs {
		m.Headers = map[string]string{"X-Kept": "the producer's own"}
		if g := got[i]; !same(g, m) {
			t.Fatalf("message %d: got %+v, want %+v", i, g, m)
		}
	}
}

// RetriesInPlace checks that a failed effect is retried on the same message
// before the next one is read, so a consumer never moves past an event it
// could not apply.
func RetriesInPlace(t *testing.T, b broker.Broker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	msgs := Messages(2, 1)
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
