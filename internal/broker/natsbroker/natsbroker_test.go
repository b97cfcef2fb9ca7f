package natsbroker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/brokertest"
	"github.com/sluice-dev/sluice/internal/broker/natsbroker"
	"github.com/sluice-dev/sluice/internal/broker/natsbroker/natstest"
	"github.com/sluice-dev/sluice/internal/broker/natsembedded"
	"github.com/sluice-dev/sluice/internal/testkit"
)

func startNATS(t *testing.T) *natsembedded.Server {
	t.Helper()
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

func open(t *testing.T, url string, opts broker.Options) *natsbroker.JetStream {
	t.Helper()
	b, err := natsbroker.Open(context.Background(), url, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	b := open(t, srv.ClientURL(), broker.Options{Namespace: brokertest.Namespace(t)})
	brokertest.RoundTrip(t, b, brokertest.Messages(200, 7))
}

// A producer's headers under names the system reserves (a row another
// writer put straight into the outbox) are not published: the consumer
// reads the event's own id and aggregate, and no replay target. Until 7
// December a Sluice-Replay-To had every other consumer acknowledge the
// event unapplied, a Sluice-Event-Id deduplicated two events as one, and a
// Nats-Expected-Stream made JetStream refuse the publish.
func TestProducerHeadersCannotPassForTheSystems(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	b := open(t, srv.ClientURL(), broker.Options{Namespace: brokertest.Namespace(t)})
	brokertest.ProducerHeadersCannotPassForTheSystems(t, b)
}

// A message already in the stream whose producer headers used reserved
// names (published before they were dropped) reads as the system sent it:
// its event id from Nats-Msg-Id, no replay target (only a replay carries
// one), and none of those headers handed on as the producer's.
func TestAStoredMessageReadsTheSystemsValuesOnly(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	ctx := context.Background()
	b := open(t, srv.ClientURL(), broker.Options{Namespace: brokertest.Namespace(t)})
	want := brokertest.Messages(1, 1)[0]
	m := nats.NewMsg(b.Subject(want.Topic))
	for k, v := range brokertest.ForgedHeaders() {
		m.Header.Set(k, v)
	}
	m.Header.Del("Nats-Expected-Stream")
	m.Header.Set(jetstream.MsgIDHeader, want.ID)
	m.Header.Set(broker.HeaderAggregateType, want.AggregateType)
	m.Header.Set(broker.HeaderAggregateID, want.AggregateID)
	m.Header.Set(broker.HeaderAggregateSeq, strconv.FormatInt(want.AggregateSeq, 10))
	m.Header.Set(broker.HeaderEventType, want.EventType)
	m.Data = want.Payload
	if _, err := natstest.Admin(t, srv.ClientURL()).PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var got broker.Message
	if err := b.Subscribe(sctx, "reader", func(_ context.Context, m broker.Message) error {
		got = m
		cancel()
		return nil
	}); err != nil || got.ID == "" {
		t.Fatalf("Subscribe = %v, read %+v; want the message", err, got)
	}
	want.Headers = map[string]string{"X-Kept": "the producer's own"}
	if got.ID != want.ID || got.ReplayTo != "" || got.Shards != 0 || got.Topic != want.Topic || fmt.Sprint(got.Headers) != fmt.Sprint(want.Headers) {
		t.Fatalf("read %+v, want %+v", got, want)
	}
}

func TestOpenRejectsAnInvalidNamespace(t *testing.T) {
	t.Parallel()
	if _, err := natsbroker.Open(context.Background(), "nats://127.0.0.1:1", broker.Options{Namespace: "Bad Name"}); err == nil {
		t.Fatal("an invalid namespace was accepted")
	}
}

// The event id is the Nats-Msg-Id: a relay republishing an id (after a crash
// before its mark) does not store it twice within the duplicate window.
func TestDeduplicatesByEventID(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	ctx := context.Background()
	b := open(t, srv.ClientURL(), broker.Options{Namespace: brokertest.Namespace(t)})
	m := brokertest.Messages(1, 1)[0]
	for range 3 {
		if err := b.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	js := natstest.Admin(t, srv.ClientURL())
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

func TestRetriesAFailedEffectInPlace(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	brokertest.RetriesInPlace(t, open(t, srv.ClientURL(), broker.Options{Namespace: brokertest.Namespace(t)}))
}

// A consumer that dies holding delivered but unacknowledged messages (a
// crash, a cut connection) must not let its successor run ahead of them: the
// successor would apply later events of an aggregate first, and the inbox
// would then drop the redelivered earlier ones as stale, losing their
// effects. JetStream therefore keeps one message in flight per consumer, and
// the successor sees every sequence in order.
func TestConsumerCrashKeepsOrder(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	opts := broker.Options{Namespace: brokertest.Namespace(t), AckWait: 2 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pub := open(t, srv.ClientURL(), opts)
	msgs := brokertest.Messages(300, 1) // one aggregate: sequences 1..300
	for _, m := range msgs {
		if err := pub.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}

	// The first consumer applies sequence 1, then hangs on 2 and dies.
	first := open(t, srv.ClientURL(), opts)
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

	second := open(t, srv.ClientURL(), opts)
	var got []int64
	secondCtx, stop := context.WithCancel(ctx)
	err := second.Subscribe(secondCtx, "reader", func(_ context.Context, m broker.Message) error {
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
// client publishes again once a server is back on the port and folder. The
// log says when the connection went and when it came back.
func TestPublishDuringOutageIsUnavailable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv, err := natsembedded.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	port := srv.Port()
	ctx := context.Background()
	var logs testkit.Buffer
	b := open(t, srv.ClientURL(), broker.Options{Namespace: brokertest.Namespace(t), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer func() {
		// The client calls its handlers on a goroutine of its own.
		testkit.Eventually(t, "the log to say the connection went and came back", func() (bool, error) {
			return strings.Contains(logs.String(), "NATS connection lost; reconnecting") && strings.Contains(logs.String(), "NATS connection restored"), nil
		})
	}()
	msgs := brokertest.Messages(2, 1)
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
	srv, err = natsembedded.StartAt(dir, port)
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

// PublishBatch stores every message of the batch (one outcome each), with
// the same subject and headers as Publish, deduplicated by event id.
func TestPublishBatch(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	ctx := context.Background()
	b := open(t, srv.ClientURL(), broker.Options{Namespace: brokertest.Namespace(t)})
	var _ broker.BatchPublisher = b
	msgs := brokertest.Messages(150, 150)
	for round := range 2 { // the second round only repeats ids: no new messages
		errs := b.PublishBatch(ctx, msgs)
		if len(errs) != len(msgs) {
			t.Fatalf("round %d: %d outcomes for %d messages", round, len(errs), len(msgs))
		}
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: message %d: %v", round, i, err)
			}
		}
	}
	js := natstest.Admin(t, srv.ClientURL())
	st, err := js.Stream(ctx, b.Stream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != uint64(len(msgs)) {
		t.Fatalf("stream holds %d messages, want %d", info.State.Msgs, len(msgs))
	}
	last := msgs[len(msgs)-1]
	got, err := st.GetLastMsgForSubject(ctx, b.Subject(last.Topic))
	if err != nil {
		t.Fatal(err)
	}
	if got.Header.Get(jetstream.MsgIDHeader) != last.ID || got.Header.Get(broker.HeaderAggregateID) != last.AggregateID ||
		got.Header.Get(broker.HeaderAggregateSeq) != "1" || string(got.Data) != string(last.Payload) {
		t.Fatalf("stored %v %q", got.Header, got.Data)
	}
}

// With the server gone, every message of a batch fails as ErrUnavailable.
func TestPublishBatchDuringOutageIsUnavailable(t *testing.T) {
	t.Parallel()
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b := open(t, srv.ClientURL(), broker.Options{Namespace: brokertest.Namespace(t)})
	srv.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for i, err := range b.PublishBatch(ctx, brokertest.Messages(5, 5)) {
		if !errors.Is(err, broker.ErrUnavailable) {
			t.Fatalf("message %d with the server down: %v, want ErrUnavailable", i, err)
		}
	}
}

// A sharded message travels on "<ns>.s<N>.<k>.<topic>", comes back with its
// own topic and shard, and a shard's subscription reads only its shard, in
// order, resuming right after the position it is given.
func TestShardedSubjectsAndSubscribeShard(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := open(t, srv.ClientURL(), broker.Options{Namespace: "shardsub"})
	const shards = 4
	var want []broker.Message // shard 2's, in publish order
	for i := range 40 {
		agg := string(rune('a' + i%8))
		m := broker.Message{ID: "id-" + agg + "-" + string(rune('0'+i/8)), Topic: "invoice.issued", AggregateType: "inv", AggregateID: agg,
			AggregateSeq: int64(i/8 + 1), EventType: "invoice.issued.v1", Payload: []byte(`{}`),
			Shards: shards, Shard: broker.ShardOf("inv", agg, shards)}
		if err := b.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
		if m.Shard == 2 {
			want = append(want, m)
		}
	}
	if len(want) == 0 {
		t.Fatal("no aggregate of the test fell on shard 2; pick other ids")
	}
	read := func(after uint64, n int) []broker.Message {
		var got []broker.Message
		sctx, stop := context.WithCancel(ctx)
		defer stop()
		err := b.SubscribeShard(sctx, broker.ShardSubscription{Consumer: "c", Shards: shards, Shard: 2, Batch: 3, After: after},
			func(_ context.Context, batch []broker.Message) error {
				if len(batch) > 3 {
					t.Errorf("batch of %d, want at most 3", len(batch))
				}
				got = append(got, batch...)
				if len(got) >= n {
					stop()
				}
				return nil
			})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	got := read(0, len(want))
	if len(got) != len(want) {
		t.Fatalf("read %d of shard 2's %d messages", len(got), len(want))
	}
	for i, m := range got {
		w := want[i]
		if m.ID != w.ID || m.Topic != "invoice.issued" || m.Shard != 2 || m.Shards != shards || m.AggregateSeq != w.AggregateSeq || m.Position == 0 {
			t.Fatalf("message %d = %+v, want %s on topic invoice.issued, shard 2/4, with a position", i, m, w.ID)
		}
		if i > 0 && m.Position <= got[i-1].Position {
			t.Fatalf("positions not increasing: %d after %d", m.Position, got[i-1].Position)
		}
		if len(m.Headers) != 0 {
			t.Fatalf("transport headers leaked to the consumer: %v", m.Headers)
		}
	}
	// Resume after the second message: the rest, from the third.
	rest := read(got[1].Position, len(want)-2)
	if len(rest) != len(want)-2 || rest[0].ID != want[2].ID {
		t.Fatalf("resumed read %d messages starting %v, want %d starting %s", len(rest), rest, len(want)-2, want[2].ID)
	}
	// An unsharded subscriber on the same stream sees the topic without
	// the shard tokens.
	var first broker.Message
	sctx, stop := context.WithCancel(ctx)
	if err := b.Subscribe(sctx, "plain", func(_ context.Context, m broker.Message) error { first = m; stop(); return nil }); err != nil {
		t.Fatal(err)
	}
	if first.Topic != "invoice.issued" {
		t.Fatalf("unsharded reader saw topic %q", first.Topic)
	}
}

// deleteStream deletes b's stream behind its back, as an operator (or a
// JetStream cluster losing it) would while relays run.
func deleteStream(t *testing.T, url string, b *natsbroker.JetStream) {
	t.Helper()
	if err := natstest.Admin(t, url).DeleteStream(context.Background(), b.Stream()); err != nil {
		t.Fatalf("delete stream %s: %v", b.Stream(), err)
	}
}

// streamMsgs is how many messages b's stream holds.
func streamMsgs(t *testing.T, url string, b *natsbroker.JetStream) uint64 {
	t.Helper()
	ctx := context.Background()
	st, err := natstest.Admin(t, url).Stream(ctx, b.Stream())
	if err != nil {
		t.Fatalf("stream %s: %v", b.Stream(), err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// tuneStream changes b's stream's settings as an operator would.
func tuneStream(t *testing.T, js jetstream.JetStream, b *natsbroker.JetStream, f func(*jetstream.StreamConfig)) {
	t.Helper()
	natstest.TuneStream(t, js, b.Stream(), f)
}

// A publish that finds no stream (deleted while the relay ran) is not the
// message's failure: it is broker.ErrUnavailable, so the relay spends no
// attempt and dead-letters nothing, its error names the stream, and the
// publisher creates the stream again, so the next publish is stored. A
// batch meeting the missing stream fails whole as ErrUnavailable and
// creates the stream once.
func TestPublishToADeletedStreamIsUnavailableAndRecreatesIt(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	ctx := context.Background()
	b := open(t, srv.ClientURL(), broker.Options{Namespace: brokertest.Namespace(t)})
	msgs := brokertest.Messages(4, 1)
	if err := b.Publish(ctx, msgs[0]); err != nil {
		t.Fatal(err)
	}

	deleteStream(t, srv.ClientURL(), b)
	err := b.Publish(ctx, msgs[1])
	if !errors.Is(err, broker.ErrUnavailable) || !strings.Contains(err.Error(), b.Stream()) ||
		!strings.Contains(err.Error(), "created again") {
		t.Fatalf("publish with the stream deleted: %v, want ErrUnavailable naming stream %s, created again", err, b.Stream())
	}
	if err := b.Publish(ctx, msgs[1]); err != nil {
		t.Fatalf("publish after the stream was created again: %v", err)
	}
	if n := streamMsgs(t, srv.ClientURL(), b); n != 1 {
		t.Fatalf("the recreated stream holds %d messages, want the 1 published since", n)
	}

	// The batch path, after the publisher's last recreation: the missing
	// stream fails every message as ErrUnavailable.
	deleteStream(t, srv.ClientURL(), b)
	batch := brokertest.Messages(20, 20)
	for i, err := range b.PublishBatch(ctx, batch) {
		if !errors.Is(err, broker.ErrUnavailable) {
			t.Fatalf("message %d of a batch with the stream deleted: %v, want ErrUnavailable", i, err)
		}
	}
}

// A subscriber whose stream is deleted under it (its durable consumer goes
// with the stream) does not stop: it starts a new session once the stream is
// back, and reads what is published there, in order.
func TestSubscribeOutlivesADeletedStream(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := open(t, srv.ClientURL(), broker.Options{Namespace: brokertest.Namespace(t)})
	msgs := brokertest.Messages(10, 1)
	got := make(chan broker.Message, len(msgs))
	done := make(chan error, 1)
	go func() {
		done <- b.Subscribe(ctx, "reader", func(_ context.Context, m broker.Message) error {
			got <- m
			return nil
		})
	}()
	if err := b.Publish(ctx, msgs[0]); err != nil {
		t.Fatal(err)
	}
	if m := <-got; m.ID != msgs[0].ID {
		t.Fatalf("first message %s, want %s", m.ID, msgs[0].ID)
	}

	deleteStream(t, srv.ClientURL(), b)
	for _, m := range msgs[1:] {
		err := b.Publish(ctx, m)
		if errors.Is(err, broker.ErrUnavailable) { // the first one finds no stream and creates it
			err = b.Publish(ctx, m)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range msgs[1:] {
		select {
		case m := <-got:
			if m.ID != want.ID {
				t.Fatalf("after the stream was deleted: got %s, want %s (order lost)", m.ID, want.ID)
			}
		case err := <-done:
			t.Fatalf("Subscribe returned when its stream was deleted: %v", err)
		case <-ctx.Done():
			t.Fatalf("message %s never arrived after the stream was deleted", want.ID)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Subscribe at the end: %v", err)
	}
}

// A shard's position counts in its stream's epoch: every message carries
// it, it survives a server restart (a restart must not send readers back
// to the start), a position of another epoch — or, stored before epochs
// were, beyond the stream's end — starts at the beginning, and a reader
// whose stream is deleted and created again under it stops with the new
// epoch rather than go on at its old sequence in the new stream.
func TestShardReaderAfterTheStreamIsCreatedAgain(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv, err := natsembedded.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	port := srv.Port()
	defer func() { srv.Shutdown() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := open(t, srv.ClientURL(), broker.Options{Namespace: brokertest.Namespace(t)})
	publish := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			m := broker.Message{ID: "id-" + strconv.Itoa(i), Topic: "t", AggregateType: "a", AggregateID: "x", AggregateSeq: int64(i + 1),
				EventType: "t.v1", Payload: []byte(`{}`), Shards: 1}
			// Again after a failure: the client reconnecting after a
			// restart (a request sent meanwhile times out), or the stream
			// found missing (and created again).
			for try := 0; ; try++ {
				pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
				err := b.Publish(pctx, m)
				pcancel()
				if err == nil {
					break
				}
				if try == 20 {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	// read reads n messages from after/epoch, or returns early with the
	// subscription's error.
	read := func(after uint64, epoch string, n int) ([]broker.Message, error) {
		var got []broker.Message
		sctx, stop := context.WithCancel(ctx)
		defer stop()
		err := b.SubscribeShard(sctx, broker.ShardSubscription{Consumer: "c", Shards: 1, After: after, Epoch: epoch},
			func(_ context.Context, batch []broker.Message) error {
				got = append(got, batch...)
				if len(got) >= n {
					stop()
				}
				return nil
			})
		return got, err
	}
	publish(0, 10)
	got, err := read(0, "", 10)
	if err != nil || len(got) != 10 || got[9].Position != 10 || got[0].Epoch == "" || got[9].Epoch != got[0].Epoch {
		t.Fatalf("first read: %d messages, %v; want 10 to position 10 with one epoch: %+v", len(got), err, got)
	}
	epoch := got[0].Epoch

	srv.Shutdown()
	if srv, err = natsembedded.StartAt(dir, port); err != nil {
		t.Fatal(err)
	}
	publish(10, 12) // waits for the client to reconnect
	if got, err = read(10, epoch, 2); err != nil || len(got) < 2 || got[0].Position != 11 || got[0].Epoch != epoch {
		t.Fatalf("after a server restart: %v, %+v; want positions 11 and 12 in the same epoch", err, got)
	}
	if got, err = read(500, "", 1); err != nil || len(got) == 0 || got[0].Position != 1 {
		t.Fatalf("a position without epoch beyond the stream's end: %v, %+v; want the stream's first message", err, got)
	}

	// Deleted and created again under a running reader, shorter than
	// before: the reader waits past the new stream's end until it reads
	// the epoch again.
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	ended := make(chan error, 1)
	var late []broker.Message
	go func() {
		ended <- b.SubscribeShard(sctx, broker.ShardSubscription{Consumer: "c", Shards: 1, After: 12, Epoch: epoch},
			func(_ context.Context, batch []broker.Message) error {
				late = append(late, batch...)
				return nil
			})
	}()
	// Past the reader's first idle check (every 5 s without a message):
	// the checks go on while it stays idle.
	time.Sleep(5500 * time.Millisecond)
	deleteStream(t, srv.ClientURL(), b)
	publish(100, 103)
	select {
	case err := <-ended:
		if err == nil || !strings.Contains(err.Error(), "created again") || len(late) != 0 {
			t.Fatalf("the reader of a stream created again ended with %v after %d messages; want the new epoch named, nothing handed over", err, len(late))
		}
	case <-ctx.Done():
		t.Fatal("the reader of a deleted stream never noticed the stream was created again")
	}
	got, err = read(12, epoch, 3)
	if err != nil || len(got) < 3 || got[0].Position != 1 || got[0].ID != "id-100" || got[0].Epoch == epoch {
		t.Fatalf("from the old epoch's position: %v, %+v; want the new stream's 3 messages from position 1 in a new epoch", err, got)
	}
}

// Open leaves an existing stream as the operator tuned it (here a MaxAge
// and a message limit), and refuses, saying what to do, a stream of the
// same name that does not capture the namespace's subjects.
// The relay marks an event published on JetStream's ack. A stream an
// operator created that does not store what it acknowledges (memory
// storage, or persist mode async) is named in a warning at start; the
// stream Sluice creates (file storage) is not.
func TestOpenWarnsOfAStreamThatDoesNotStoreWhatItAcknowledges(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	ctx := context.Background()
	js := natstest.Admin(t, srv.ClientURL())
	for name, c := range map[string]struct {
		cfg  func(ns string) *jetstream.StreamConfig // nil: Open creates it
		warn string
	}{
		"memory": {func(ns string) *jetstream.StreamConfig {
			return &jetstream.StreamConfig{Storage: jetstream.MemoryStorage}
		}, "in memory"},
		"async": {func(ns string) *jetstream.StreamConfig {
			return &jetstream.StreamConfig{Storage: jetstream.FileStorage, PersistMode: jetstream.AsyncPersistMode}
		}, "persist mode async"},
		"Sluice's own": {nil, ""},
	} {
		ns := brokertest.Namespace(t)
		if c.cfg != nil {
			cfg := c.cfg(ns)
			cfg.Name, cfg.Subjects = strings.ToUpper(ns), []string{ns + ".>"}
			if _, err := js.CreateStream(ctx, *cfg); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		var logs testkit.Buffer
		b, err := natsbroker.Open(ctx, srv.ClientURL(), broker.Options{Namespace: ns, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b.Close()
		got := logs.String()
		if c.warn == "" && strings.Contains(got, "level=WARN") || c.warn != "" && !strings.Contains(got, c.warn) {
			t.Errorf("%s stream: Open logged %q, want a warning saying %q", name, got, c.warn)
		}
	}
}

func TestOpenKeepsTheOperatorsStreamSettings(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	ctx := context.Background()
	js := natstest.Admin(t, srv.ClientURL())

	ns := brokertest.Namespace(t)
	b := open(t, srv.ClientURL(), broker.Options{Namespace: ns})
	tuneStream(t, js, b, func(c *jetstream.StreamConfig) { c.MaxAge, c.MaxMsgs = time.Hour, 1000 })
	open(t, srv.ClientURL(), broker.Options{Namespace: ns}) // a relay or consumer starting again
	st, err := js.Stream(ctx, b.Stream())
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config; got.MaxAge != time.Hour || got.MaxMsgs != 1000 {
		t.Fatalf("after Open: MaxAge %v, MaxMsgs %d; want the operator's 1h and 1000", got.MaxAge, got.MaxMsgs)
	}

	other := brokertest.Namespace(t) + "x"
	stream := strings.ToUpper(other)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{other + ".orders.>"}}); err != nil {
		t.Fatal(err)
	}
	_, err = natsbroker.Open(ctx, srv.ClientURL(), broker.Options{Namespace: other})
	if err == nil || !strings.Contains(err.Error(), other+".>") || !strings.Contains(err.Error(), "add that subject") {
		t.Fatalf("Open over a stream without the namespace's subjects: %v, want a refusal naming %s.>", err, other)
	}
}

// A stream that cannot take any message now (here full, with the discard-new
// policy an operator may set) is an outage: broker.ErrUnavailable, so the
// relay pauses instead of dead-lettering what it tries meanwhile. A refusal
// the message itself causes stays its failure, or the relay would wait for
// ever on it: too large for the stream, or over its subject's own limit.
func TestStoreRefusalsTellTheStreamFromTheMessage(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	ctx := context.Background()
	js := natstest.Admin(t, srv.ClientURL())
	b := open(t, srv.ClientURL(), broker.Options{Namespace: brokertest.Namespace(t)})
	msg := func(i int, topic string, payload string) broker.Message {
		return broker.Message{ID: "id-" + strconv.Itoa(i), Topic: topic, AggregateType: "a", AggregateID: "x", AggregateSeq: int64(i + 1),
			EventType: "t.v1", Payload: []byte(payload)}
	}

	tuneStream(t, js, b, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 200 })
	err := b.Publish(ctx, msg(0, "t", `{"pad":"`+strings.Repeat("x", 300)+`"}`))
	if err == nil || errors.Is(err, broker.ErrUnavailable) {
		t.Fatalf("a message larger than the stream's MaxMsgSize: %v, want the message's failure", err)
	}

	tuneStream(t, js, b, func(c *jetstream.StreamConfig) {
		c.MaxMsgSize, c.MaxMsgsPerSubject, c.Discard, c.DiscardNewPerSubject = 0, 1, jetstream.DiscardNew, true
	})
	if err := b.Publish(ctx, msg(1, "one", `{}`)); err != nil {
		t.Fatal(err)
	}
	err = b.Publish(ctx, msg(2, "one", `{}`))
	if err == nil || errors.Is(err, broker.ErrUnavailable) {
		t.Fatalf("over the subject's own limit: %v, want the message's failure (one topic must not pause the relay)", err)
	}

	tuneStream(t, js, b, func(c *jetstream.StreamConfig) { c.MaxMsgsPerSubject, c.DiscardNewPerSubject, c.MaxMsgs = -1, false, 2 })
	if err := b.Publish(ctx, msg(3, "two", `{}`)); err != nil { // the stream holds "one" and now "two"
		t.Fatal(err)
	}
	for i, publish := range []func() error{
		func() error { return b.Publish(ctx, msg(4, "three", `{}`)) },
		func() error { return b.PublishBatch(ctx, []broker.Message{msg(5, "three", `{}`)})[0] },
	} {
		if err := publish(); !errors.Is(err, broker.ErrUnavailable) || !strings.Contains(err.Error(), "maximum messages exceeded") {
			t.Fatalf("publish %d into a full discard-new stream: %v, want ErrUnavailable naming the limit", i, err)
		}
	}
}

// A JetStream that stores but does not acknowledge (a stream set to NoAck
// here; a stalled server or a cluster without a leader in production) is
// an outage, not the messages' failure: every publish of the batch that
// waited in vain is ErrUnavailable naming the timeout, so the relay spends
// no attempt. The messages were stored nonetheless, and once acks come
// back the relay's republish of the same ids is dropped by the stream.
func TestAStreamThatStopsAcknowledgingIsUnavailable(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	js := natstest.Admin(t, srv.ClientURL())
	b := open(t, srv.ClientURL(), broker.Options{Namespace: brokertest.Namespace(t)})
	msgs := brokertest.Messages(6, 3)
	if err := b.Publish(context.Background(), msgs[0]); err != nil {
		t.Fatal(err)
	}

	tuneStream(t, js, b, func(c *jetstream.StreamConfig) { c.NoAck = true })
	stalled := func(what string, errs ...error) {
		t.Helper()
		for i, err := range errs {
			if !errors.Is(err, broker.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "acknowledged nothing") {
				t.Fatalf("%s %d to a stream that stopped acknowledging: %v, want ErrUnavailable on the timeout", what, i, err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	stalled("publish", b.Publish(ctx, msgs[1]))
	cancel()
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	stalled("batch message", b.PublishBatch(ctx, msgs[2:])...)
	cancel()
	if n := streamMsgs(t, srv.ClientURL(), b); n != 6 {
		t.Fatalf("the stream holds %d messages, want 6 (stored without an ack)", n)
	}

	tuneStream(t, js, b, func(c *jetstream.StreamConfig) { c.NoAck = false })
	for i, err := range b.PublishBatch(context.Background(), msgs[1:]) {
		if err != nil {
			t.Fatalf("republish %d once acks are back: %v", i, err)
		}
	}
	if n := streamMsgs(t, srv.ClientURL(), b); n != 6 {
		t.Fatalf("the stream holds %d messages after the republish, want 6 (the duplicate window drops the ids it stored)", n)
	}
}
