// Package natsbroker is the NATS JetStream adapter of the broker contract:
// acknowledged publishes into one stream, deduplicated by event id, and
// durable pull consumers that hold one message at a time.
package natsbroker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/broker"
)

// JetStream publishes to and consumes from one JetStream stream.
type JetStream struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	prefix  string // subject prefix: subjects are prefix.topic
	stream  string
	ackWait time.Duration
	// Subscribe's retries (broker.RetryConsume).
	maxFailures int
	log         *slog.Logger

	// recreated is when a publish that found no stream last created it
	// again (recreateStream); guarded by recreateMu.
	recreateMu sync.Mutex
	recreated  time.Time

	// acks counts the publishes JetStream has acknowledged: a publish whose
	// ack did not come tells a stalled JetStream from its own trouble by
	// whether this moved meanwhile (publishError).
	acks atomic.Uint64
}

// Open connects to a NATS server with JetStream and creates the stream
// if it is missing. Publishes set Nats-Msg-Id to the event id, so the stream's
// duplicate window drops a relay's republish of an id it already stored.
func Open(ctx context.Context, rawURL string, opts broker.Options) (*JetStream, error) {
	return open(ctx, rawURL, opts, publishAckTimeout)
}

// publishAckTimeout is how long the client waits for the answer to an
// asynchronous publish (PublishBatch) before giving up on it. The client
// keeps a slot for every publish it has not had an answer to, and refuses
// new publishes once 4,000 are taken; without a timeout a publish JetStream
// never answers (sent during a stall, or to a cluster electing a leader)
// kept its slot for the life of the connection, so a few stalls left the
// relay's publisher refusing everything for good. It outlasts the relay's
// publish timeout (a third of RELAY_LEASE: 10 s by default); a longer one
// meets this as its timeout, which publishError tells apart the same way.
const publishAckTimeout = 30 * time.Second

// open is Open with the asynchronous publishes' timeout given (tests
// shorten it).
func open(ctx context.Context, rawURL string, opts broker.Options, ackTimeout time.Duration) (*JetStream, error) {
	ns, err := opts.ValidNamespace()
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	// The client reconnects by itself; the log says when the connection
	// went and came back (an outage drill cut it 140 times and no line
	// said so), never with credentials (the URL is redacted).
	nc, err := nats.Connect(rawURL,
		nats.Name("sluice"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500*time.Millisecond),
		nats.DisconnectErrHandler(func(c *nats.Conn, err error) {
			if !c.IsClosed() {
				log.Warn("broker: NATS connection lost; reconnecting", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info("broker: NATS connection restored", "server", c.ConnectedUrlRedacted())
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("broker: connect to NATS: %w", err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(ackTimeout))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("broker: JetStream: %w", err)
	}
	n := &JetStream{nc: nc, js: js, prefix: ns, stream: strings.ToUpper(strings.ReplaceAll(ns, "-", "_")), ackWait: 30 * time.Second,
		maxFailures: opts.MaxConsumeFailures, log: log}
	if opts.AckWait > 0 {
		n.ackWait = opts.AckWait
	}
	if err := n.ensureStream(ctx); err != nil {
		nc.Close()
		return nil, err
	}
	return n, nil
}

// ensureStream creates the stream when it is missing, and otherwise leaves
// it as it is: its replicas, limits and retention are the operator's to
// tune. Until 7 December Open updated an existing stream to Sluice's
// config, so every relay or consumer start undid them (a MaxAge set to
// bound the disk, replicas raised to 3). It checks what Sluice relies on:
// the stream captures every subject of the namespace (else publishes to
// the others would find no stream), and a duplicate window short enough to
// let a relay's republish through is said in the log.
func (n *JetStream) ensureStream(ctx context.Context) error {
	st, err := n.js.CreateStream(ctx, n.streamConfig())
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		st, err = n.js.Stream(ctx, n.stream)
	}
	if err != nil {
		return fmt.Errorf("broker: create stream %s: %w", n.stream, err)
	}
	cfg := st.CachedInfo().Config
	if want := n.prefix + ".>"; !slices.Contains(cfg.Subjects, want) {
		return fmt.Errorf("broker: stream %s exists with subjects %q, without %q, on which Sluice publishes: add that subject to it, or delete it and let Sluice create it",
			n.stream, cfg.Subjects, want)
	}
	if want := n.streamConfig().Duplicates; cfg.Duplicates < want {
		n.log.Warn("broker: the stream's duplicate window is shorter than Sluice's default; a relay's republish after a crash may be stored twice (consumers' inboxes absorb it)",
			"stream", n.stream, "duplicates", cfg.Duplicates, "default", want)
	}
	// The relay marks an event published on JetStream's ack: what the
	// stream's own settings make of that ack is said here. Whether the
	// server syncs each write (sync_interval: always) no client can read,
	// so a single-replica file stream goes unmentioned (README, "NATS
	// JetStream").
	switch {
	case cfg.Storage == jetstream.MemoryStorage:
		n.log.Warn("broker: the stream keeps messages in memory: events the outbox marks published are lost when the NATS server stops (create it with file storage)",
			"stream", n.stream)
	case cfg.PersistMode == jetstream.AsyncPersistMode:
		n.log.Warn("broker: the stream acknowledges writes before they are stored (persist mode async): events the outbox marks published can be lost when the NATS server stops or its host crashes",
			"stream", n.stream)
	}
	return nil
}

// streamConfig is the stream Open creates, and a publish that finds it
// gone creates again (recreateStream).
func (n *JetStream) streamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:       n.stream,
		Subjects:   []string{n.prefix + ".>"},
		Storage:    jetstream.FileStorage,
		Duplicates: 2 * time.Minute,
	}
}

// Stream is the JetStream stream name.
func (n *JetStream) Stream() string { return n.stream }

// Subject is where a topic's messages go.
func (n *JetStream) Subject(topic string) string { return n.prefix + "." + topic }

// ShardSubject is where a topic's messages on shard shard of shards go:
// "<ns>.s<shards>.<shard>.<topic>".
func (n *JetStream) ShardSubject(shards, shard int, topic string) string {
	return n.prefix + "." + broker.ShardToken(shards, shard) + "." + topic
}

// ShardFilter is the filter subject of one shard, every topic.
func (n *JetStream) ShardFilter(shards, shard int) string {
	return n.prefix + "." + broker.ShardToken(shards, shard) + ".>"
}

// Publish stores msg in the stream and waits for JetStream's ack.
func (n *JetStream) Publish(ctx context.Context, msg broker.Message) error {
	m := n.natsMsg(msg)
	before := n.acks.Load()
	if _, err := n.js.PublishMsg(ctx, m, noResponderRetries...); err != nil {
		return n.publishError(ctx, m.Subject, err, before)
	}
	n.acks.Add(1)
	return nil
}

// PublishBatch sends every message asynchronously on the one connection,
// then waits for all of JetStream's acks: one round trip for the batch
// instead of one per message. errs[i] is msgs[i]'s outcome.
func (n *JetStream) PublishBatch(ctx context.Context, msgs []broker.Message) []error {
	errs := make([]error, len(msgs))
	futs := make([]jetstream.PubAckFuture, len(msgs))
	subjects := make([]string, len(msgs))
	before := n.acks.Load()
	for i, msg := range msgs {
		m := n.natsMsg(msg)
		subjects[i] = m.Subject
		if err := ctx.Err(); err != nil {
			// Sending stalled past the deadline (the client waits for
			// free slots): told apart like an ack that did not come.
			errs[i] = n.publishError(ctx, m.Subject, err, before)
			continue
		}
		f, err := n.js.PublishMsgAsync(m, noResponderRetries...)
		if err != nil {
			errs[i] = n.publishError(ctx, m.Subject, err, before)
			continue
		}
		futs[i] = f
	}
	for i, f := range futs {
		if f == nil {
			continue
		}
		select {
		case <-f.Ok():
			n.acks.Add(1)
		case err := <-f.Err():
			errs[i] = n.publishError(ctx, subjects[i], err, before)
		case <-ctx.Done():
			select {
			case <-f.Ok(): // it came as the wait ended
				n.acks.Add(1)
			default:
				errs[i] = n.publishError(ctx, subjects[i], ctx.Err(), before)
			}
		}
	}
	return errs
}

// publishError classifies a failed publish: broker.ErrUnavailable when the
// broker could not take any message (the connection, or no stream to store
// it), a failure of this message otherwise.
//
// No stream answering (the client's "no responders", after its own two
// retries) means no stream holds the subject: the stream was deleted while
// the relay ran, or JetStream is not running on the server (disabled, out of
// storage, a cluster without a meta leader). Nothing was stored, and nothing
// about the message caused it: counted as the message's failure, it spent an
// attempt of every event the relay tried and dead-lettered them all once
// their attempts ran out, each aggregate's later events then overtaking the
// dead head. As ErrUnavailable the relay gives them back and pauses, the
// backlog and its age grow on the dashboard, and the stream is created again
// (recreateStream), as a restarted relay would.
//
// An ack that did not come in time is an outage too when JetStream
// acknowledged no other publish since this one was sent (acks still at
// before): the stream's server stalls (its disk), or its cluster is
// electing a leader, as in a rolling restart. Counted as the message's
// failure, every event tried during such a stall spent an attempt, and a
// stall longer than the backoff dead-lettered the head of every aggregate.
// The message may have been stored; sent again within the stream's
// duplicate window it is dropped there (Nats-Msg-Id), later the consumers'
// inboxes drop it. When other publishes were acknowledged meanwhile,
// JetStream answers and this one's ack is what went missing: that stays
// the publish's failure, so a message whose ack never comes cannot pause
// every relay for ever.
func (n *JetStream) publishError(ctx context.Context, subject string, err error, before uint64) error {
	if !n.nc.IsConnected() {
		return fmt.Errorf("%w: publish to %s while disconnected: %w", broker.ErrUnavailable, subject, err)
	}
	if connectionLost(err) {
		return fmt.Errorf("%w: publish to %s: the connection failed: %w", broker.ErrUnavailable, subject, err)
	}
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("%w: publish to %s: no JetStream stream answered (stream %s deleted, or JetStream not running on the server)%s: %w",
			broker.ErrUnavailable, subject, n.stream, n.recreateStream(ctx), err)
	}
	if storeRefused(err) {
		return fmt.Errorf("%w: publish to %s: JetStream cannot store into stream %s now: %w", broker.ErrUnavailable, subject, n.stream, err)
	}
	if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
		return fmt.Errorf("%w: publish to %s: JetStream has not answered the client's last publishes (stream %s stalled, or its cluster has no leader): %w",
			broker.ErrUnavailable, subject, n.stream, err)
	}
	if ackTimedOut(err) && n.acks.Load() == before {
		return fmt.Errorf("%w: publish to %s: JetStream acknowledged nothing within the publish timeout (stream %s stalled, or its cluster has no leader): %w",
			broker.ErrUnavailable, subject, n.stream, err)
	}
	return fmt.Errorf("broker: publish to %s: %w", subject, err)
}

// noResponderRetries are the client's own retries of a publish no stream
// answered ("no responders": JetStream restarting, or the stream gone): two,
// 50 ms apart, instead of the client's 250 ms. Its answer must come within
// the shortest publish timeout the relay allows (RELAY_LEASE's minimum of
// 1 s ÷ 3): with the default wait a deleted stream took about half a second
// to tell, so under a short publish timeout it looked like a stall, and the
// relay paused without ever creating the stream again. The relay's pause
// and probe are the retries that matter.
var noResponderRetries = []jetstream.PublishOpt{jetstream.WithRetryAttempts(2), jetstream.WithRetryWait(50 * time.Millisecond)}

// ackTimedOut says whether a publish ended waiting for JetStream's ack:
// its context's deadline (the relay's publish timeout), or the client's
// own timeouts.
func ackTimedOut(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrAsyncPublishTimeout)
}

// The JetStream error codes of a stream or server that cannot take any
// message now (nats-server's jetstream_errors_generated.go).
const (
	errCodeClusterNotAvailable  = 10008 // JetStream system temporarily unavailable
	errCodeInsufficientResource = 10023 // the account's or server's storage limit
	errCodeMemoryExceeded       = 10028
	errCodeNotEnabledForAccount = 10039
	errCodeStorageExceeded      = 10047
	errCodeNotEnabled           = 10076
	errCodeStoreFailed          = 10077 // "{err}": see storeRefused
	errCodeStreamOffline        = 10118
)

// storeRefused says whether JetStream refused to store a message for a
// reason of its own that the next message meets as well: out of storage or
// memory, JetStream off or its cluster without a leader, the stream offline,
// or full with the discard-new policy (its MaxMsgs or MaxBytes reached: a
// consumer far behind, or a limit too low). The relay then pauses and the
// backlog waits in the outbox; counted as the message's failure, a full
// stream dead-lettered everything tried until it had room. Never a refusal
// the message causes — too large ("message too large" under the same store
// code, or 10054), or its subject's own limit (MaxMsgsPerSubject, one topic)
// —: a relay paused on such a message would wait for ever, when the failure
// backs it off and in the end dead-letters it alone.
func storeRefused(err error) bool {
	var api *jetstream.APIError
	if !errors.As(err, &api) {
		return false
	}
	switch api.ErrorCode {
	case errCodeClusterNotAvailable, errCodeInsufficientResource, errCodeMemoryExceeded, errCodeNotEnabledForAccount,
		errCodeStorageExceeded, errCodeNotEnabled, errCodeStreamOffline:
		return true
	case errCodeStoreFailed:
		return api.Description == "maximum messages exceeded" || api.Description == "maximum bytes exceeded"
	}
	return false
}

// recreateInterval is how often at most a publisher creates its stream
// again: a batch of 500 that meets a missing stream tries once, not 500
// times, and a server whose JetStream is down is asked once per interval.
const recreateInterval = 5 * time.Second

// recreateStream creates the stream again after a publish found none, at
// most once per recreateInterval, and says what happened for the publish's
// error. It only creates: a stream that exists again (another relay was
// first) is left as it is.
func (n *JetStream) recreateStream(ctx context.Context) string {
	n.recreateMu.Lock()
	defer n.recreateMu.Unlock()
	if !n.recreated.IsZero() && time.Since(n.recreated) < recreateInterval {
		return ""
	}
	n.recreated = time.Now()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, err := n.js.CreateStream(cctx, n.streamConfig())
	switch {
	case err == nil:
		return "; the stream has been created again"
	case errors.Is(err, jetstream.ErrStreamNameAlreadyInUse):
		return "; the stream exists again"
	default:
		return "; creating the stream again failed: " + err.Error()
	}
}

// connectionLost says whether a publish failed on the connection itself: a
// write or read on a socket the server has closed, or the client's own
// "disconnected" errors. Such an error can reach the caller before the
// client has noticed the disconnect (IsConnected still true): bench R4 saw a
// publish fail with "write: broken pipe" at the moment the server stopped,
// counted against a healthy event as a failed attempt. The message may or
// may not have arrived; as ErrUnavailable it is sent again later without
// spending an attempt (the stream deduplicates by event id). A timeout is not
// among them: an ack that does not come on a live connection is told apart
// by publishError.
func connectionLost(err error) bool {
	var opErr *net.OpError
	return errors.As(err, &opErr) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) ||
		errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrDisconnected) || errors.Is(err, nats.ErrStaleConnection)
}

// natsMsg is msg as JetStream stores it: the event id as Nats-Msg-Id (the
// stream's dedupe key) and the aggregate in headers.
//
// A replay (msg.Replay > 0) goes to the topic's subject like the first
// publish, with Nats-Msg-Id "<id>.replay.<n>" (the stream's duplicate window
// would drop the event id itself if it was published in the last two
// minutes, and still drops a relay's republish of the same replay) and the
// event id in Sluice-Event-Id for consumers of one's own; this adapter reads
// it back from Nats-Msg-Id (fromNATS).
// A replay for one consumer carries its name in Sluice-Replay-To: every
// durable consumer reads the stream's subjects, so the others receive the
// message too and acknowledge it without handling it (Subscribe). The price
// is that each other consumer reads the replayed messages once; JetStream
// has no per-consumer destination a publisher can choose.
func (n *JetStream) natsMsg(msg broker.Message) *nats.Msg {
	subject := n.Subject(msg.Topic)
	if msg.Shards > 0 {
		subject = n.ShardSubject(msg.Shards, msg.Shard, msg.Topic)
	}
	m := nats.NewMsg(subject)
	// The producer's headers first, but none of the names the system
	// reserves: the system's own are set after them or left unset, so a row
	// another writer put straight into the outbox can neither pass for them
	// (a Sluice-Replay-To, a Sluice-Event-Id) nor steer JetStream (a
	// Nats-Expected-Stream refused the publish, a Nats-Rollup purges).
	for k, v := range msg.Headers {
		if !broker.ReservedHeader(k) {
			m.Header.Set(k, v)
		}
	}
	if msg.Shards > 0 {
		m.Header.Set(broker.HeaderShard, strconv.Itoa(msg.Shard)+"/"+strconv.Itoa(msg.Shards))
	}
	m.Header.Set(jetstream.MsgIDHeader, msg.ID)
	if msg.Replay > 0 {
		m.Header.Set(jetstream.MsgIDHeader, msg.ID+".replay."+strconv.Itoa(msg.Replay))
		m.Header.Set(broker.HeaderEventID, msg.ID)
	}
	if msg.ReplayTo != "" {
		m.Header.Set(broker.HeaderReplayTo, msg.ReplayTo)
	}
	m.Header.Set(broker.HeaderAggregateType, msg.AggregateType)
	m.Header.Set(broker.HeaderAggregateID, msg.AggregateID)
	m.Header.Set(broker.HeaderAggregateSeq, strconv.FormatInt(msg.AggregateSeq, 10))
	m.Header.Set(broker.HeaderEventType, msg.EventType)
	m.Data = msg.Payload
	return m
}

// Subscribe consumes on a durable pull consumer named consumer, one message
// at a time so per-aggregate order is kept, until ctx ends. The client
// rides out a lost connection on its own; a session the server ends (the
// consumer or the stream deleted under it) is started again like
// RabbitMQ's (broker.RetryConsume: logged, paused, given up after
// Options.MaxConsumeFailures in a row), the durable consumer and, if need
// be, the stream created again. A consumer created again starts at the
// stream's first message: the inbox drops what it already applied.
func (n *JetStream) Subscribe(ctx context.Context, consumer string, h broker.Handler) error {
	if err := broker.ValidateConsumer(consumer); err != nil {
		return err
	}
	return broker.RetryConsume(ctx, n.log, n.maxFailures, "JetStream", "consumer", consumer, func(ctx context.Context) (bool, error) {
		return n.consume(ctx, consumer, h)
	})
}

// consume is one session of Subscribe: consumed once the durable consumer
// exists and its messages are read.
func (n *JetStream) consume(ctx context.Context, consumer string, h broker.Handler) (consumed bool, err error) {
	cons, err := n.js.CreateOrUpdateConsumer(ctx, n.stream, jetstream.ConsumerConfig{
		Durable:       consumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		FilterSubject: n.prefix + ".>",
		AckWait:       n.ackWait,
		// One message in flight, as RabbitMQ's Qos(1): with more, messages
		// delivered to a client that then died (crash, cut connection) come
		// back only after AckWait, after their successors were applied, and
		// the inbox would drop them as stale: lost effects.
		MaxAckPending: 1,
	})
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return false, fmt.Errorf("broker: create consumer %s: %w%s", consumer, err, n.recreateStream(ctx))
	}
	if err != nil {
		return false, fmt.Errorf("broker: create consumer %s: %w", consumer, err)
	}
	// The pull asks for a few, but MaxAckPending lets the server hand out
	// one at a time.
	it, err := cons.Messages(jetstream.PullMaxMessages(64))
	if err != nil {
		return false, fmt.Errorf("broker: consume %s: %w", consumer, err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	for {
		jm, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return true, nil
			}
			return true, fmt.Errorf("broker: next message: %w", err)
		}
		msg := fromNATS(jm)
		if msg.ReplayTo != "" && msg.ReplayTo != consumer {
			// A replay for another consumer: not ours to apply.
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = jm.DoubleAck(actx)
			cancel()
			continue
		}
		if herr := broker.HandleInPlace(ctx, h, msg, func() { _ = jm.InProgress() }); herr != nil {
			// Stopped while the effect was failing: hand it back for later.
			_ = jm.Nak()
			continue
		}
		// DoubleAck waits for the server to confirm the ack, so a message is
		// not redelivered after we return (it would only be a duplicate).
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = jm.DoubleAck(actx)
		cancel()
	}
}

// fromNATS reads a stored message back. What the system decides comes
// from what only the system sets: the event id from Nats-Msg-Id (a replay's
// "<id>.replay.<n>" gives <id>; Sluice-Event-Id says the same for other
// readers), a replay's target only on a replay, the shard only when the
// subject carries its tokens. A message stored before producers' reserved
// headers were dropped on publish then still reads as the system sent it;
// such headers are never handed on as the producer's.
func fromNATS(jm jetstream.Msg) broker.Message {
	h := jm.Headers()
	seq, _ := strconv.ParseInt(h.Get(broker.HeaderAggregateSeq), 10, 64)
	id, replay := replayOf(h.Get(jetstream.MsgIDHeader))
	msg := broker.Message{
		ID:            id,
		AggregateType: h.Get(broker.HeaderAggregateType),
		AggregateID:   h.Get(broker.HeaderAggregateID),
		AggregateSeq:  seq,
		EventType:     h.Get(broker.HeaderEventType),
		Payload:       jm.Data(),
	}
	if replay {
		msg.ReplayTo = h.Get(broker.HeaderReplayTo)
	}
	if i := strings.IndexByte(jm.Subject(), '.'); i >= 0 {
		msg.Topic = jm.Subject()[i+1:]
	}
	if sh := h.Get(broker.HeaderShard); sh != "" {
		// "<shard>/<shards>": the subject's shard tokens are not the topic.
		if a, b, ok := strings.Cut(sh, "/"); ok {
			shard, _ := strconv.Atoi(a)
			shards, _ := strconv.Atoi(b)
			if token := broker.ShardToken(shards, shard) + "."; strings.HasPrefix(msg.Topic, token) {
				msg.Shard, msg.Shards = shard, shards
				msg.Topic = strings.TrimPrefix(msg.Topic, token)
			}
		}
	}
	for k := range h {
		if broker.ReservedHeader(k) {
			continue
		}
		if msg.Headers == nil {
			msg.Headers = map[string]string{}
		}
		msg.Headers[k] = h.Get(k)
	}
	return msg
}

// replayOf reads a Nats-Msg-Id: a replay's "<id>.replay.<n>" (natsMsg) is
// event id <id>, any other is the event id itself.
func replayOf(msgID string) (id string, replay bool) {
	base, n, ok := strings.Cut(msgID, ".replay.")
	if !ok || n == "" || strings.Trim(n, "0123456789") != "" {
		return msgID, false
	}
	return base, true
}

// SubscribeShard reads one shard in stream order through an ordered
// consumer (an ephemeral, flow-controlled consumer that the client
// recreates at the right place after a gap), starting after s.After, and
// hands h what has arrived, at most s.Batch messages at a time, each with
// its stream sequence as Position. Nothing is acknowledged to JetStream:
// the consumer's position lives with its effects (inbox.ShardedConsumer
// commits it in the batch's transaction), so a restart resumes exactly
// after the last committed batch, and a batch that was read but not
// committed (crash, cut connection, failed effect) is simply read again,
// in order. It returns h's error, or nil once ctx ends.
//
// Positions count in the stream's epoch (its creation time, each message's
// Epoch). A stream deleted and created again counts from 1 again, and the
// ordered consumer, recreated after the deletion, would go on at its last
// sequence + 1 in the new stream, silently skipping that many messages. So
// a position of another epoch starts at the beginning, and whenever the
// ordered consumer has been (re)created — its own sequence starts again —
// the stream's epoch is read again before the batch is handed over: a new
// epoch ends the subscription (errStreamCreatedAgain), unhandled, and the
// caller starts again from its stored position, which is then of another
// epoch.
func (n *JetStream) SubscribeShard(ctx context.Context, s broker.ShardSubscription, h broker.BatchHandler) error {
	if err := broker.ValidateConsumer(s.Consumer); err != nil {
		return err
	}
	if s.Shards < 1 || s.Shards > broker.MaxShards || s.Shard < 0 || s.Shard >= s.Shards {
		return fmt.Errorf("broker: shard %d of %d is out of range", s.Shard, s.Shards)
	}
	size := s.Batch
	if size <= 0 {
		size = 500
	}
	epoch, last, err := n.streamEpoch(ctx)
	if err != nil {
		return fmt.Errorf("broker: shard %d/%d of %s: %w", s.Shard, s.Shards, s.Consumer, err)
	}
	after := s.After
	if after > 0 && (s.Epoch != "" && s.Epoch != epoch || s.Epoch == "" && after > last) {
		n.log.Warn("broker: the stream was created again since the shard's stored position; reading the shard from the stream's first message",
			"stream", n.stream, "consumer", s.Consumer, "shard", s.Shard, "shards", s.Shards, "position", after, "position_epoch", s.Epoch, "epoch", epoch)
		after = 0
	}
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{n.ShardFilter(s.Shards, s.Shard)},
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: time.Minute,
	}
	if after > 0 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = after + 1
	}
	cons, err := n.js.OrderedConsumer(ctx, n.stream, cfg)
	if err != nil {
		return fmt.Errorf("broker: shard %d/%d of %s: %w", s.Shard, s.Shards, s.Consumer, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(2 * size))
	if err != nil {
		return fmt.Errorf("broker: shard %d/%d of %s: %w", s.Shard, s.Shards, s.Consumer, err)
	}
	defer it.Stop()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// One goroutine reads the iterator (its Next blocks); the loop below
	// takes whatever has arrived as one batch.
	type next struct {
		msg broker.Message
		err error
		// fresh: the first message of an ordered consumer the client has
		// (re)created (its sequence started again).
		fresh bool
	}
	arrived := make(chan next, 2*size)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var consumerSeq uint64
		for {
			jm, err := it.Next()
			if err != nil {
				select {
				case arrived <- next{err: err}:
				case <-rctx.Done():
				}
				return
			}
			msg := fromNATS(jm)
			msg.Epoch = epoch
			fresh := true // without metadata, check every time
			if md, err := jm.Metadata(); err == nil {
				msg.Position = md.Sequence.Stream
				fresh = md.Sequence.Consumer <= consumerSeq || consumerSeq == 0
				consumerSeq = md.Sequence.Consumer
			}
			select {
			case arrived <- next{msg: msg, fresh: fresh}:
			case <-rctx.Done():
				return
			}
		}
	}()
	defer func() { cancel(); it.Stop(); <-done }()
	batch := make([]broker.Message, 0, size)
	idle := time.NewTimer(epochCheckIdle)
	defer idle.Stop()
	var readErr error // the reader's last word, after the messages before it
	for {
		if readErr != nil {
			if ctx.Err() != nil || errors.Is(readErr, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("broker: shard %d/%d of %s: next message: %w", s.Shard, s.Shards, s.Consumer, readErr)
		}
		batch = batch[:0]
		verify := false
		select {
		case <-ctx.Done():
			return nil
		case <-idle.C:
			// Nothing arrived for a while: a stream created again shorter
			// than the deleted one would keep the reader waiting past its
			// end without a word.
			if err := n.sameEpoch(ctx, s, epoch); err != nil {
				return err
			}
			idle.Reset(epochCheckIdle)
			continue
		case nx := <-arrived:
			if nx.err != nil {
				readErr = nx.err
				continue
			}
			batch, verify = append(batch, nx.msg), nx.fresh
		}
	fill:
		for len(batch) < size {
			select {
			case nx := <-arrived:
				if nx.err != nil {
					readErr = nx.err
					break fill
				}
				batch, verify = append(batch, nx.msg), verify || nx.fresh
			default:
				break fill
			}
		}
		if verify {
			// Read after the messages arrived: a stream created again
			// before they were sent shows here.
			if err := n.sameEpoch(ctx, s, epoch); err != nil {
				return err
			}
		}
		if err := h(ctx, batch); err != nil {
			return err
		}
		idle.Reset(epochCheckIdle)
	}
}

// errStreamCreatedAgain ends a shard's subscription whose stream was
// deleted and created again under it: its positions count anew.
var errStreamCreatedAgain = errors.New("the stream was created again: positions count from 1 again")

// epochCheckIdle is how long a shard reader waits without a message before
// it reads the stream's epoch again.
const epochCheckIdle = 5 * time.Second

// sameEpoch is nil while the stream's epoch is still epoch, and
// errStreamCreatedAgain once it is not.
func (n *JetStream) sameEpoch(ctx context.Context, s broker.ShardSubscription, epoch string) error {
	now, _, err := n.streamEpoch(ctx)
	if err == nil && now != epoch {
		err = fmt.Errorf("%w (epoch %s, now %s)", errStreamCreatedAgain, epoch, now)
	}
	if err != nil {
		return fmt.Errorf("broker: shard %d/%d of %s: %w", s.Shard, s.Shards, s.Consumer, err)
	}
	return nil
}

// streamEpoch is the stream's epoch (its creation time) and last sequence.
func (n *JetStream) streamEpoch(ctx context.Context) (epoch string, last uint64, err error) {
	st, err := n.js.Stream(ctx, n.stream)
	if err != nil {
		return "", 0, fmt.Errorf("read stream %s: %w", n.stream, err)
	}
	info := st.CachedInfo()
	return info.Created.UTC().Format(time.RFC3339Nano), info.State.LastSeq, nil
}

// DeleteStream removes the namespace's stream and with it its consumers
// (the demo cleans up a NATS server it does not own with it). A stream
// already gone is no error.
func (n *JetStream) DeleteStream(ctx context.Context) error {
	if err := n.js.DeleteStream(ctx, n.stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("broker: delete stream %s: %w", n.stream, err)
	}
	return nil
}

// Close drains nothing: the publisher waits for acks, so there is nothing
// buffered to lose.
func (n *JetStream) Close() error {
	n.nc.Close()
	return nil
}
