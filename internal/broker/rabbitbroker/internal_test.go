package rabbitbroker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/brokertest"
	"github.com/sluice-dev/sluice/internal/testkit"
)

func open(t *testing.T, opts broker.Options) *RabbitMQ {
	t.Helper()
	opts.Namespace = brokertest.Namespace(t)
	r, err := Open(context.Background(), brokertest.RabbitURL, opts)
	if err != nil {
		t.Fatalf("RabbitMQ on 127.0.0.1:5672 (guest/guest) is needed: %v", err)
	}
	t.Cleanup(func() {
		if err := r.DeleteNamespace("reader"); err != nil {
			t.Logf("cleanup: %v", err)
		}
		r.Close()
	})
	return r
}

// A publish that gave up (its context ended) before the broker returned its
// message as unroutable leaves nothing behind: the late return is dropped,
// so the relay's retry of the same event, now routable, is not reported
// unroutable, and the bookkeeping holds no entry once no publish waits.
func TestStaleReturnsAreDropped(t *testing.T) {
	t.Parallel()
	r := open(t, broker.Options{})
	ctx := context.Background()
	msgs := brokertest.Messages(21, 21)
	waitConfirm := r.waitConfirm

	// No queue yet: every message is returned. The first publish gives up
	// once the broker confirmed (its return is then in the buffer), the
	// others at once (their returns come after they are gone).
	r.waitConfirm = func(_ context.Context, dc *amqp.DeferredConfirmation) (bool, error) {
		<-dc.Done()
		return false, context.DeadlineExceeded
	}
	if err := r.Publish(ctx, msgs[0]); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("publish that gave up = %v, want DeadlineExceeded", err)
	}
	r.waitConfirm = func(context.Context, *amqp.DeferredConfirmation) (bool, error) {
		return false, context.DeadlineExceeded
	}
	for _, m := range msgs[1:] {
		if err := r.Publish(ctx, m); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("publish that gave up = %v, want DeadlineExceeded", err)
		}
	}

	// Now a queue receives them: the retries are routed, and confirmed after
	// every earlier return arrived.
	r.waitConfirm = waitConfirm
	if err := r.DeclareQueue("reader"); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := r.Publish(ctx, m); err != nil {
			t.Fatalf("retry of %s once a queue exists: %v (a stale return was taken for its own)", m.ID, err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.waiting) != 0 {
		t.Fatalf("%d publish entries left with no publish waiting: %v", len(r.waiting), r.waiting)
	}
	if len(r.returns) != 0 {
		t.Fatalf("%d returns left in the buffer", len(r.returns))
	}
}

// A session cut under a running consumer (connection lost) is retried and
// the consumer goes on; each cut follows a session that worked, so it
// counts as the first failure in a row, never as one more: two cuts with
// MaxConsumeFailures 2 do not stop it.
func TestSubscribeRidesOutCutConnections(t *testing.T) {
	t.Parallel()
	r := open(t, broker.Options{MaxConsumeFailures: 2})
	if err := r.DeclareQueue("reader"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	subCtx, stop := context.WithCancel(ctx)
	seen := make(chan string, 100)
	done := make(chan error, 1)
	go func() {
		done <- r.Subscribe(subCtx, "reader", func(_ context.Context, m broker.Message) error {
			seen <- m.ID
			return nil
		})
	}()
	msgs := brokertest.Messages(3, 1)
	for i, m := range msgs {
		if err := r.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
		// Wait for it (a cut may deliver an earlier one again first).
		for got := ""; got != m.ID; {
			select {
			case got = <-seen:
			case err := <-done:
				t.Fatalf("Subscribe returned %v before message %d arrived", err, i)
			case <-ctx.Done():
				t.Fatalf("message %d never arrived", i)
			}
		}
		if i < len(msgs)-1 {
			r.mu.Lock()
			conn := r.conn
			r.mu.Unlock()
			_ = conn.Close()
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Subscribe = %v after two cut connections, want nil", err)
	}
}

// A confirm that does not come within the publish timeout is the broker's
// stall when RabbitMQ confirmed nothing else since the publish was sent (a
// memory or disk alarm blocks every publisher: sent again later, without
// spending an attempt), and the publish's own failure when another publish
// was confirmed meanwhile. The seam plays the confirm that never comes; the
// other publish is a real one.
func TestAMissingConfirmIsAnOutageOnlyWhenNothingWasConfirmed(t *testing.T) {
	t.Parallel()
	r := open(t, broker.Options{})
	ctx := context.Background()
	if err := r.DeclareQueue("reader"); err != nil {
		t.Fatal(err)
	}
	msgs := brokertest.Messages(3, 3)
	waitConfirm := r.waitConfirm

	r.waitConfirm = func(context.Context, *amqp.DeferredConfirmation) (bool, error) {
		return false, context.DeadlineExceeded
	}
	if err := r.Publish(ctx, msgs[0]); !errors.Is(err, broker.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("no confirm and none since: %v, want ErrUnavailable on the timeout", err)
	}

	// The first publish's confirm goes missing while the second's comes.
	var calls atomic.Int32
	gaveUp := make(chan struct{})
	r.waitConfirm = func(ctx context.Context, dc *amqp.DeferredConfirmation) (bool, error) {
		if calls.Add(1) == 1 {
			<-gaveUp
			return false, context.DeadlineExceeded
		}
		return waitConfirm(ctx, dc)
	}
	first := make(chan error, 1)
	go func() { first <- r.Publish(ctx, msgs[1]) }()
	deadline := time.Now().Add(30 * time.Second)
	for calls.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first publish never waited for its confirm")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := r.Publish(ctx, msgs[2]); err != nil {
		t.Fatalf("a publish the broker confirms: %v", err)
	}
	close(gaveUp)
	if err := <-first; err == nil || errors.Is(err, broker.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("no confirm while another was confirmed: %v, want the publish's own failure", err)
	}
}

// A batch is sent a window at a time and each message gets its own
// outcome: the routable ones stored in batch order, the unroutable ones
// (a replay to a queue that does not exist) ErrUnroutable among them, and
// no bookkeeping left behind. 700 messages span three windows.
func TestPublishBatchGivesEachMessageItsOutcome(t *testing.T) {
	t.Parallel()
	r := open(t, broker.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := r.DeclareQueue("reader"); err != nil {
		t.Fatal(err)
	}
	msgs := brokertest.Messages(700, 700)
	var want []string
	for i := range msgs {
		if i%50 == 7 {
			msgs[i].ReplayTo = "ghost"
			continue
		}
		want = append(want, msgs[i].ID)
	}
	errs := r.PublishBatch(ctx, msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("%d outcomes for %d messages", len(errs), len(msgs))
	}
	for i, err := range errs {
		if unroutable := msgs[i].ReplayTo != ""; unroutable != errors.Is(err, ErrUnroutable) || (!unroutable && err != nil) {
			t.Fatalf("message %d (replay to %q): %v", i, msgs[i].ReplayTo, err)
		}
	}
	r.mu.Lock()
	waiting, returns := len(r.waiting), len(r.returns)
	r.mu.Unlock()
	if waiting != 0 || returns != 0 {
		t.Fatalf("%d publish entries and %d returns left behind", waiting, returns)
	}

	var got []string
	subCtx, stop := context.WithCancel(ctx)
	if err := r.Subscribe(subCtx, "reader", func(_ context.Context, m broker.Message) error {
		if got = append(got, m.ID); len(got) == len(want) {
			stop()
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the queue holds %d messages, want the %d routable ones in batch order", len(got), len(want))
	}
}

// In a batch, a confirm that does not come while the broker went on
// answering (here another caller's publish, confirmed while the first
// message's wait gave up) is that message's own failure, not an outage that
// would pause the relay; the window's other messages are stored.
func TestPublishBatchMissingConfirmAmongAnsweredOnes(t *testing.T) {
	t.Parallel()
	r := open(t, broker.Options{})
	ctx := context.Background()
	if err := r.DeclareQueue("reader"); err != nil {
		t.Fatal(err)
	}
	all := brokertest.Messages(6, 6)
	msgs, other := all[:5], all[5]
	waitConfirm := r.waitConfirm
	var calls atomic.Int32
	r.waitConfirm = func(ctx context.Context, dc *amqp.DeferredConfirmation) (bool, error) {
		if calls.Add(1) == 1 {
			<-dc.Done()
			// The broker answers someone else meanwhile (its confirm is
			// waited for by this seam's second call, for real).
			if err := r.Publish(ctx, other); err != nil {
				t.Errorf("another caller's publish: %v", err)
			}
			return false, context.DeadlineExceeded // the wait plays one that gave up
		}
		return waitConfirm(ctx, dc)
	}
	errs := r.PublishBatch(ctx, msgs)
	if err := errs[0]; err == nil || errors.Is(err, broker.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the missing confirm: %v, want the message's own failure", err)
	}
	for i, err := range errs[1:] {
		if err != nil {
			t.Fatalf("message %d: %v", i+1, err)
		}
	}
}

// A batch larger than a window runs under one publish timeout: when the
// first window's waits take all of it, the later windows are not sent at
// all, and their messages say so as ErrUnavailable (given back, no
// attempt spent), not as failures of their own.
func TestPublishBatchSendsNoWindowAfterTheTimeout(t *testing.T) {
	t.Parallel()
	r := open(t, broker.Options{})
	if err := r.DeclareQueue("reader"); err != nil {
		t.Fatal(err)
	}
	r.waitConfirm = func(ctx context.Context, _ *amqp.DeferredConfirmation) (bool, error) {
		<-ctx.Done() // every confirm of the first window "takes" the whole timeout
		return false, ctx.Err()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	msgs := brokertest.Messages(publishWindow+44, publishWindow+44)
	errs := r.PublishBatch(ctx, msgs)
	for i, err := range errs[publishWindow:] {
		if !errors.Is(err, broker.ErrUnavailable) || !strings.Contains(err.Error(), "not sent") {
			t.Fatalf("message %d of the second window: %v, want ErrUnavailable, not sent", publishWindow+i, err)
		}
	}
	// Only the first window reached the queue.
	conn, err := amqp.Dial(brokertest.RabbitURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, "the first window in the queue", func() bool {
		q, err := ch.QueueDeclarePassive(r.Queue("reader"), true, false, false, false, nil)
		return err == nil && q.Messages == publishWindow
	})
}

// A message AMQP cannot carry (a header name or an event type over 255
// bytes, headers larger than the connection's frame size; a row another
// writer put in the outbox can hold any of them) fails alone and unsent, as
// its own failure (ErrOverAMQPLimit, never ErrUnavailable); the batch's
// other messages are stored, once each. Until 7 December the client failed
// the frame write and closed the connection: every confirm in flight read
// as the broker's nack ("a queue is full"), the whole batch was given back
// and the relay paused, though the messages before the bad one were
// enqueued (sent again later: duplicates).
func TestAMessageOverAnAMQPLimitFailsAloneUnsent(t *testing.T) {
	t.Parallel()
	r := open(t, broker.Options{})
	if err := r.DeclareQueue("reader"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msgs := brokertest.Messages(7, 7)
	msgs[1].Headers = map[string]string{strings.Repeat("k", 256): "v"}
	msgs[3].EventType = strings.Repeat("t", 256)
	msgs[5].Headers = map[string]string{"Big": strings.Repeat("v", 200_000)} // the default frame is 128 KiB
	bad := map[int]bool{1: true, 3: true, 5: true}
	errs := r.PublishBatch(ctx, msgs)
	for i, err := range errs {
		if bad[i] != errors.Is(err, ErrOverAMQPLimit) || errors.Is(err, broker.ErrUnavailable) || (!bad[i] && err != nil) {
			t.Errorf("message %d: %v", i, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	// The connection carried on: the next publish needs no new one.
	r.mu.Lock()
	conn := r.conn
	r.mu.Unlock()
	if err := r.Publish(ctx, brokertest.Messages(8, 8)[7]); err != nil || conn.IsClosed() {
		t.Fatalf("a publish after the refusals: %v (connection closed: %v)", err, conn.IsClosed())
	}
	var got []string
	subCtx, stop := context.WithCancel(ctx)
	if err := r.Subscribe(subCtx, "reader", func(_ context.Context, m broker.Message) error {
		if got = append(got, m.ID); len(got) == 5 {
			stop()
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []string{msgs[0].ID, msgs[2].ID, msgs[4].ID, msgs[6].ID, "id-0007"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the queue held %v, want %v", got, want)
	}
}

// The frame check counts a message's properties and headers as the client
// writes them, to AMQP's limit (the frame, its 8 bytes of framing included,
// within the negotiated frame size; RabbitMQ 3.10 closes the connection 8
// bytes past it): the largest header value it lets through is carried, one
// byte more is refused unsent.
func TestTheFrameCheckIsExact(t *testing.T) {
	t.Parallel()
	r := open(t, broker.Options{})
	if err := r.DeclareQueue("reader"); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	frameMax, conn := r.frameMax, r.conn
	// The next two publishes' tokens, one byte each (base 36).
	token := strconv.FormatUint(r.sequence+1, 36)
	r.mu.Unlock()
	msg := brokertest.Messages(1, 1)[0]
	fits := func(n int) bool {
		m := msg
		m.Headers = map[string]string{"Big": strings.Repeat("v", n)}
		_, key, p := r.publishing(m, token)
		return withinAMQPLimits(key, p, frameMax) == nil
	}
	lo, hi := 0, frameMax // fits(lo), !fits(hi)
	for hi-lo > 1 {
		if mid := (lo + hi) / 2; fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msg.Headers = map[string]string{"Big": strings.Repeat("v", lo)}
	if err := r.Publish(ctx, msg); err != nil || conn.IsClosed() {
		t.Fatalf("the largest value the check lets through (%d bytes, frame size %d): %v (connection closed: %v)", lo, frameMax, err, conn.IsClosed())
	}
	msg.Headers = map[string]string{"Big": strings.Repeat("v", lo+1)}
	if err := r.Publish(ctx, msg); !errors.Is(err, ErrOverAMQPLimit) {
		t.Fatalf("one byte more: %v, want ErrOverAMQPLimit", err)
	}
}

// A confirm the client resolves because the publishing channel closed is
// not the broker's nack: the outcome is unknown (the message may be
// enqueued), an outage the relay rides out (broker.ErrUnavailable), and the
// error says the channel closed and why. Until 7 December it read "RabbitMQ
// refused (nack) …: a queue it routes to is full". Here the channel closes
// because the exchange was deleted under the publisher.
func TestAConfirmLostToAClosedChannelIsUnknownNotANack(t *testing.T) {
	t.Parallel()
	r := open(t, broker.Options{})
	if err := r.DeclareQueue("reader"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msgs := brokertest.Messages(2, 2)
	if err := r.Publish(ctx, msgs[0]); err != nil {
		t.Fatal(err)
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
	if err := ch.ExchangeDelete(r.Exchange(), false, false); err != nil {
		t.Fatal(err)
	}
	err = r.Publish(ctx, msgs[1])
	if !errors.Is(err, broker.ErrUnavailable) || strings.Contains(err.Error(), "nack") || strings.Contains(err.Error(), "full") ||
		!strings.Contains(err.Error(), "unknown") || !strings.Contains(err.Error(), "NOT_FOUND") {
		t.Fatalf("publish whose channel the broker closed: %v; want ErrUnavailable, the outcome unknown and the broker's reason, no nack", err)
	}
	// The next publish opens a channel and declares the exchange again.
	if err := r.DeclareQueue("reader"); err != nil {
		t.Fatal(err)
	}
	if err := r.Publish(ctx, msgs[1]); err != nil {
		t.Fatalf("publish once the exchange exists again: %v", err)
	}
}
