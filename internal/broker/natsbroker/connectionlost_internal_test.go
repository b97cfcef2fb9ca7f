package natsbroker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/brokertest"
	"github.com/sluice-dev/sluice/internal/broker/natsbroker/natstest"
	"github.com/sluice-dev/sluice/internal/broker/natsembedded"
)

// brokenPipe returns the error a real socket gives when written after its
// peer closed it (as a NATS server that stops does), wrapped as nats.go
// hands it on.
func brokenPipe(t *testing.T) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	peer, ok := <-accepted
	if !ok {
		t.Fatal("the listener accepted nothing")
	}
	_ = peer.(*net.TCPConn).SetLinger(0) // close with a reset: the next writes fail at once
	_ = peer.Close()
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 64<<10)
	for time.Now().Before(deadline) {
		if _, err := c.Write(buf); err != nil {
			return fmt.Errorf("nats: flush: %w", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("writes to a closed peer kept succeeding for 10 s")
	return nil
}

// A publish that fails on the connection itself is the broker's outage
// (ErrUnavailable: sent again without spending an attempt), even when the
// client has not yet noticed the disconnect; a publish the broker refused or
// did not acknowledge on a live connection is not.
func TestConnectionLostTellsTheConnectionFromThePublish(t *testing.T) {
	t.Parallel()
	lost := []error{
		brokenPipe(t),
		fmt.Errorf("publish: %w", nats.ErrConnectionClosed),
		nats.ErrConnectionReconnecting,
		nats.ErrDisconnected,
		nats.ErrStaleConnection,
	}
	for _, err := range lost {
		if !connectionLost(err) {
			t.Errorf("connectionLost(%v) = false, want true", err)
		}
	}
	kept := []error{
		nats.ErrTimeout,
		context.DeadlineExceeded,
		fmt.Errorf("wait for ack: %w", context.DeadlineExceeded),
		nats.ErrMaxPayload,
		nats.ErrNoResponders,
		jetstream.ErrNoStreamResponse,
		errors.New("nats: wrong last sequence"),
	}
	for _, err := range kept {
		if connectionLost(err) {
			t.Errorf("connectionLost(%v) = true, want false", err)
		}
	}
}

// Publish's errors go through connectionLost while the client still counts
// itself connected: the moment R4 met, when a write fails before the client
// has processed the disconnect.
func TestPublishErrorOnALiveClientTellsTheConnectionFromThePublish(t *testing.T) {
	t.Parallel()
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	n, err := Open(context.Background(), srv.ClientURL(), broker.Options{Namespace: brokertest.Namespace(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	if !n.nc.IsConnected() {
		t.Fatal("the client is not connected to a running server")
	}
	if err := n.publishError(context.Background(), "subject", brokenPipe(t), n.acks.Load()); !errors.Is(err, broker.ErrUnavailable) {
		t.Fatalf("a broken pipe on a client that counts itself connected: %v, want ErrUnavailable", err)
	}
	// An ack timeout on a live connection is JetStream's stall when it
	// acknowledged nothing since the publish was sent, and the publish's
	// own failure when it acknowledged others meanwhile.
	if err := n.Publish(context.Background(), brokertest.Messages(1, 1)[0]); err != nil {
		t.Fatal(err)
	}
	for _, timeout := range []error{nats.ErrTimeout, context.DeadlineExceeded, fmt.Errorf("wait: %w", jetstream.ErrAsyncPublishTimeout)} {
		if err := n.publishError(context.Background(), "subject", timeout, n.acks.Load()); !errors.Is(err, broker.ErrUnavailable) || !errors.Is(err, timeout) {
			t.Errorf("%v with no ack since the publish was sent: %v, want ErrUnavailable wrapping it", timeout, err)
		}
		if err := n.publishError(context.Background(), "subject", timeout, n.acks.Load()-1); errors.Is(err, broker.ErrUnavailable) {
			t.Errorf("%v while another publish was acknowledged: %v, want a failed publish", timeout, err)
		}
	}
	if err := n.publishError(context.Background(), "subject", context.Canceled, n.acks.Load()); errors.Is(err, broker.ErrUnavailable) {
		t.Errorf("a publish cancelled by its caller: %v, want no outage", err)
	}
}

// storeRefused reads the codes JetStream answers a publish with, as the
// client wraps them: the stream's or the server's refusals are outages,
// the message's own are not, whatever their HTTP-like code says (a message
// too large comes with 503 under the store code).
func TestStoreRefusedTellsTheStreamFromTheMessage(t *testing.T) {
	t.Parallel()
	api := func(code int, errCode jetstream.ErrorCode, desc string) error {
		return fmt.Errorf("nats: %w", &jetstream.APIError{Code: code, ErrorCode: errCode, Description: desc})
	}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{api(503, 10008, "JetStream system temporarily unavailable"), true},
		{api(503, 10023, "insufficient resources"), true},
		{api(500, 10028, "insufficient memory resources available"), true},
		{api(503, 10039, "JetStream not enabled for account"), true},
		{api(500, 10047, "insufficient storage resources available"), true},
		{api(503, 10076, "JetStream not enabled"), true},
		{api(500, 10118, "stream is offline"), true},
		{api(503, 10077, "maximum messages exceeded"), true},
		{api(503, 10077, "maximum bytes exceeded"), true},
		{api(503, 10077, "maximum messages per subject exceeded"), false},
		{api(503, 10077, "message too large"), false},
		{api(400, 10054, "message size exceeds maximum allowed"), false},
		{api(400, 10003, "bad request"), false},
		{nats.ErrTimeout, false},
	} {
		if got := storeRefused(c.err); got != c.want {
			t.Errorf("storeRefused(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// A long stall leaves many publishes unanswered. The client keeps a slot
// for each until its answer comes, and refuses new publishes past 4,000 of
// them: that refusal is an outage, not the messages' failure, and once
// JetStream answers again the publisher works as soon as the unanswered
// publishes' timeout has freed their slots (without it they kept them for
// the connection's life). The timeout is shortened here from 30 s.
func TestALongStallLeavesThePublisherWorking(t *testing.T) {
	t.Parallel()
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	const ackTimeout = 500 * time.Millisecond
	n, err := open(context.Background(), srv.ClientURL(), broker.Options{Namespace: brokertest.Namespace(t)}, ackTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	admin := natstest.Admin(t, srv.ClientURL())
	setNoAck := func(on bool) {
		t.Helper()
		natstest.TuneStream(t, admin, n.Stream(), func(c *jetstream.StreamConfig) { c.NoAck = on })
	}

	setNoAck(true)
	msgs := brokertest.Messages(4500, 4500)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	errs := n.PublishBatch(ctx, msgs)
	cancel()
	stalled := 0
	for i, err := range errs {
		if !errors.Is(err, broker.ErrUnavailable) {
			t.Fatalf("message %d of 4,500 during the stall: %v, want ErrUnavailable", i, err)
		}
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			stalled++
		}
	}
	if stalled == 0 {
		t.Fatal("no publish met the client's cap on unanswered publishes: the test proved nothing about it")
	}

	setNoAck(false)
	deadline := time.Now().Add(30 * time.Second)
	for n.js.PublishAsyncPending() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d unanswered publishes still hold their slots well past their timeout", n.js.PublishAsyncPending())
		}
		time.Sleep(50 * time.Millisecond)
	}
	more := brokertest.Messages(10, 10)
	for i := range more {
		more[i].ID = "after-" + more[i].ID
	}
	for i, err := range n.PublishBatch(context.Background(), more) {
		if err != nil {
			t.Fatalf("publish %d once JetStream answers again: %v", i, err)
		}
	}
}
