// Package rabbitbroker is the RabbitMQ adapter of the broker contract:
// persistent, mandatory publishes to a durable topic exchange with publisher
// confirms, and durable single-active-consumer queues bound to it consumed
// one message at a time.
package rabbitbroker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-dev/sluice/internal/broker"
)

// ErrUnroutable reports a message the exchange could route to no queue: the
// broker confirmed it but nobody will ever read it, so it is not published.
var ErrUnroutable = errors.New("broker: message routed to no queue")

// ErrOverAMQPLimit reports a message an AMQP 0-9-1 connection cannot carry:
// a short string (routing key, message id, type, a header's name) over 255
// bytes, or properties and headers over the connection's frame size. The
// client failed the frame write and closed the connection, with every
// publish in flight on it; the adapter refuses such a message unsent, as
// its own failure.
var ErrOverAMQPLimit = errors.New("broker: the message exceeds an AMQP limit")

// headerPublishID carries a token unique to one Publish call, so a
// basic.return is matched to the publish that is waiting for it and never to
// a later publish of the same event id (a relay's retry after a timeout).
// Consumers do not see it: fromAMQP drops it.
const headerPublishID = "Sluice-Publish-Id"

// headerTopic carries the topic of a message published straight to a queue
// (a replay for one consumer), whose routing key is the queue's name.
const headerTopic = "Sluice-Topic"

// errDeliveriesClosed is a consume session ended by the broker or the
// connection rather than by us.
var errDeliveriesClosed = errors.New("delivery channel closed")

// RabbitMQ publishes to a durable topic exchange with publisher confirms and
// consumes from durable queues bound to it.
type RabbitMQ struct {
	url         string
	exchange    string
	maxFailures int // consume failures in a row before Subscribe gives up; < 0: never
	log         *slog.Logger

	mu      sync.Mutex
	conn    *amqp.Connection
	pub     *amqp.Channel
	returns chan amqp.Return
	// pubClosed tells why pub closed (closeWatch), frameMax is conn's
	// negotiated frame size (0: no limit).
	pubClosed *closeWatch
	frameMax  int
	// waiting holds one entry per Publish that is waiting for its confirm,
	// keyed by its publish token: true once the broker returned that
	// publish as unroutable. A publish removes its entry whatever its
	// outcome, and returns whose publish is gone are dropped, so the map
	// never outgrows the publishes in flight.
	waiting  map[string]bool
	sequence uint64 // last publish token

	// confirms counts the broker's answers (ack or nack) to publishes: a
	// publish whose confirm did not come tells a broker that stopped
	// confirming from its own trouble by whether this moved meanwhile.
	confirms atomic.Uint64

	// waitConfirm waits for a publish's confirm (a seam for tests that play
	// a publish giving up after its message was sent).
	waitConfirm func(ctx context.Context, dc *amqp.DeferredConfirmation) (bool, error)

	// block is the connection's connection.blocked state (watchBlocked).
	block blockState
}

// errBlocked ends the wait for a confirm when RabbitMQ blocks the
// connection.
var errBlocked = errors.New("connection blocked")

// blockState follows RabbitMQ's connection.blocked and connection.unblocked
// for the publishing connection. A resource alarm (memory or disk) blocks
// every publishing connection: the server stops reading from it, so a
// publish sent meanwhile waits unread in the socket and is delivered once
// the alarm clears. Until 7 December (twenty-fifth session) the adapter did
// not listen: each publish waited its whole timeout for a confirm (a third
// of RELAY_LEASE, 10 s by default) before the relay paused, and the relay's
// probes went on filling the socket with messages delivered again later.
// Now a publish while blocked is refused at once, unsent, and a publish
// waiting for its confirm when the block begins stops waiting: both are
// broker.ErrUnavailable with the server's reason.
type blockState struct {
	mu     sync.Mutex
	reason string          // the server's reason; "" when not blocked
	now    context.Context // cancelled (cause errBlocked) when a block begins
	cancel context.CancelCauseFunc
}

func (b *blockState) reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cancel != nil {
		b.cancel(nil)
	}
	b.reason = ""
	b.now, b.cancel = context.WithCancelCause(context.Background())
}

// state is the current block's reason ("" when none) and the context that
// is cancelled when the next block begins.
func (b *blockState) state() (string, context.Context) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.reason, b.now
}

func (b *blockState) set(blocked bool, reason string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case blocked && b.reason == "":
		if reason == "" {
			reason = "no reason given"
		}
		b.reason = reason
		b.cancel(errBlocked)
	case !blocked && b.reason != "":
		b.reason = ""
		b.now, b.cancel = context.WithCancelCause(context.Background())
	}
}

// watchBlocked follows one connection's blocked notifications until it
// closes (the client then closes the channel); a new connection starts
// unblocked.
func (r *RabbitMQ) watchBlocked(conn *amqp.Connection) {
	r.block.reset()
	notes := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	go func() {
		for b := range notes {
			r.block.set(b.Active, b.Reason)
			if b.Active {
				r.log.Warn("broker: RabbitMQ blocked publishing (a resource alarm): publishes are refused until it unblocks", "reason", b.Reason)
			} else {
				r.log.Info("broker: RabbitMQ unblocked publishing")
			}
		}
	}()
}

// Open connects to RabbitMQ and declares the exchange.
func Open(ctx context.Context, rawURL string, opts broker.Options) (*RabbitMQ, error) {
	ns, err := opts.ValidNamespace()
	if err != nil {
		return nil, err
	}
	r := &RabbitMQ{
		url: rawURL, exchange: ns, maxFailures: opts.MaxConsumeFailures, log: opts.Logger,
		waiting: map[string]bool{},
		waitConfirm: func(ctx context.Context, dc *amqp.DeferredConfirmation) (bool, error) {
			// A confirm that is already in wins over a deadline that is
			// past too (WaitContext's select would pick either).
			select {
			case <-dc.Done():
				return dc.Acked(), nil
			default:
			}
			return dc.WaitContext(ctx)
		},
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.channelLocked(); err != nil {
		return nil, err
	}
	return r, nil
}

// Exchange is the topic exchange messages are published to.
func (r *RabbitMQ) Exchange() string { return r.exchange }

// Queue is the durable queue of a consumer.
func (r *RabbitMQ) Queue(consumer string) string { return r.exchange + "." + consumer }

// channelLocked returns the publishing channel, redialling after a lost
// connection (amqp091 does not reconnect by itself).
func (r *RabbitMQ) channelLocked() (*amqp.Channel, error) {
	if r.pub != nil && !r.pub.IsClosed() {
		return r.pub, nil
	}
	if r.conn == nil || r.conn.IsClosed() {
		conn, err := amqp.DialConfig(r.url, amqp.Config{Heartbeat: 10 * time.Second, Properties: amqp.Table{"connection_name": "sluice"}})
		if err != nil {
			return nil, fmt.Errorf("broker: connect to RabbitMQ: %w", err)
		}
		r.conn = conn
		r.watchBlocked(conn)
	}
	ch, err := r.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("broker: open channel: %w", err)
	}
	if err := ch.ExchangeDeclare(r.exchange, "topic", true, false, false, false, nil); err != nil {
		ch.Close()
		return nil, fmt.Errorf("broker: declare exchange %s: %w", r.exchange, err)
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, fmt.Errorf("broker: enable publisher confirms: %w", err)
	}
	// Buffered: the client hands a basic.return over before it processes the
	// ack of the same message, so after a confirm the return (if any) is
	// already in this buffer.
	r.returns = ch.NotifyReturn(make(chan amqp.Return, returnsBuffer))
	r.pubClosed = &closeWatch{closes: ch.NotifyClose(make(chan *amqp.Error, 1))}
	r.frameMax = r.conn.Config.FrameSize
	r.pub = ch
	return ch, nil
}

// closeWatch keeps why one publishing channel closed: the broker's or the
// connection's error, "" when we closed it or it has not closed.
type closeWatch struct {
	closes <-chan *amqp.Error
	mu     sync.Mutex
	read   bool
	reason string
}

// why is the reason the channel closed. The client hands the reason over
// before it resolves the channel's pending confirms, so a confirm resolved
// by the close finds it here.
func (w *closeWatch) why() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.read {
		select {
		case e, ok := <-w.closes:
			w.read = true
			if ok && e != nil {
				w.reason = e.Error()
			}
		default:
		}
	}
	return w.reason
}

// drainReturnsLocked marks the waiting publishes the broker returned and
// drops returns whose publish already gave up.
func (r *RabbitMQ) drainReturnsLocked() {
	for {
		select {
		case ret, ok := <-r.returns:
			if !ok {
				return
			}
			token, _ := ret.Headers[headerPublishID].(string)
			if _, waiting := r.waiting[token]; waiting {
				r.waiting[token] = true
			}
		default:
			return
		}
	}
}

// Publish sends msg as a persistent, mandatory message and waits for the
// broker's confirm. MessageId is the event id; the aggregate travels in
// headers (AMQP has no property for it).
func (r *RabbitMQ) Publish(ctx context.Context, msg broker.Message) error {
	return r.publish(ctx, []broker.Message{msg})[0]
}

// publishWindow is how many messages of a batch are in flight at once. A
// message the broker returns (unroutable) is read from the returns buffer
// after its confirm; a window no larger than the buffer keeps the client's
// reader from ever blocking on a full buffer before the confirms it waits
// for.
const publishWindow = 256

// returnsBuffer holds the returns not drained yet: sixteen windows, so as
// many publishers at once on one RabbitMQ value never fill it (amqp091
// drops a return it cannot hand over within 5 s, and that message would
// read as routed).
const returnsBuffer = 16 * publishWindow

// PublishBatch sends msgs as Publish does, all of a window in flight at
// once on the publishing channel, then waits for their confirms in order:
// a round trip (and one of RabbitMQ's fsyncs) per window instead of per
// message. errs[i] is msgs[i]'s outcome, classified as Publish's. Until 7
// December (27th session) the adapter had only Publish, so the relay waited
// for each confirm before sending the next message (bench/README.md, "The
// relay on RabbitMQ").
func (r *RabbitMQ) PublishBatch(ctx context.Context, msgs []broker.Message) []error {
	errs := make([]error, len(msgs))
	for from := 0; from < len(msgs); from += publishWindow {
		to := min(from+publishWindow, len(msgs))
		if err := ctx.Err(); err != nil {
			// The windows before took the whole publish timeout: these were
			// never sent, so they are not their messages' failures.
			for i := from; i < len(msgs); i++ {
				errs[i] = fmt.Errorf("%w: %s not sent: the publish timeout ran out before its window: %w", broker.ErrUnavailable, msgs[i].ID, err)
			}
			return errs
		}
		copy(errs[from:to], r.publish(ctx, msgs[from:to]))
	}
	return errs
}

// sent is one message of a publish waiting for its confirm.
type sent struct {
	token, exchange, key string
	dc                   *amqp.DeferredConfirmation
}

// publish sends msgs (at most publishWindow) and waits for their confirms.
func (r *RabbitMQ) publish(ctx context.Context, msgs []broker.Message) []error {
	errs := make([]error, len(msgs))
	before := r.confirms.Load()
	out := make([]sent, len(msgs))
	r.mu.Lock()
	ch, err := r.channelLocked()
	closed, frameMax := r.pubClosed, r.frameMax
	if err == nil {
		for i := range out {
			r.sequence++
			out[i].token = strconv.FormatUint(r.sequence, 36)
			r.waiting[out[i].token] = false
		}
	}
	r.mu.Unlock()
	if err != nil {
		for i := range errs {
			errs[i] = fmt.Errorf("%w: %w", broker.ErrUnavailable, err)
		}
		return errs
	}
	// However a publish ends, its entry goes: a return that arrives after
	// a give-up (timeout, closed channel) is dropped, not kept forever.
	defer func() {
		r.mu.Lock()
		r.drainReturnsLocked()
		for _, o := range out {
			delete(r.waiting, o.token)
		}
		r.mu.Unlock()
	}()
	_, blockStarts := r.block.state()
	for i, msg := range msgs {
		if blockStarts.Err() != nil {
			// Blocked before or while sending the window: the server reads
			// nothing more, and a write into the full socket could wait
			// until the alarm clears. The rest is refused unsent.
			reason, _ := r.block.state()
			errs[i] = fmt.Errorf("%w: RabbitMQ blocks publishing (%s; a resource alarm): %s not sent", broker.ErrUnavailable, reason, msg.ID)
			continue
		}
		o := &out[i]
		var p amqp.Publishing
		o.exchange, o.key, p = r.publishing(msg, o.token)
		if err := withinAMQPLimits(o.key, p, frameMax); err != nil {
			// Sent, it would close the connection with the window's other
			// messages in flight: until 7 December one such event (a row
			// another writer put in the outbox) had its whole batch given
			// back, the relay paused, and the events before it enqueued
			// again later.
			errs[i] = fmt.Errorf("%w: %s not sent: %w", ErrOverAMQPLimit, msg.ID, err)
			continue
		}
		o.dc, err = ch.PublishWithDeferredConfirmWithContext(ctx, o.exchange, o.key, true, false, p)
		if err != nil {
			if errors.Is(err, amqp.ErrClosed) {
				errs[i] = fmt.Errorf("%w: publish to %s/%s: %w", broker.ErrUnavailable, r.exchange, msg.Topic, err)
			} else {
				errs[i] = fmt.Errorf("broker: publish to %s/%s: %w", r.exchange, msg.Topic, err)
			}
		}
	}
	// The waits end too when a block begins: the server reads nothing more
	// from the connection until the alarm clears.
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(blockStarts, func() { cancel(errBlocked) })
	defer stop()
	// Whether the broker answered after message i was sent: it confirmed a
	// later message of this window, or other callers' publishes (confirms
	// counted beyond this window's own). Then a confirm that did not come
	// is its message's own failure; earlier messages' confirms prove
	// nothing about a stall that began after them.
	own := uint64(0)
	answeredAfter := func(i int) bool {
		if r.confirms.Load()-before > own {
			return true
		}
		for j, o := range out {
			if j > i && o.dc != nil {
				select {
				case <-o.dc.Done():
					return true
				default:
				}
			}
		}
		return false
	}
	for i, o := range out {
		if o.dc != nil {
			var counted bool
			errs[i] = r.confirmed(ctx, wctx, ch, closed, o, msgs[i].ID, func() bool { return answeredAfter(i) }, &counted)
			if counted {
				own++ // this window's own answer, in r.confirms too
			}
		}
	}
	return errs
}

// publishing is where msg goes and what is sent: MessageId is the event
// id; the aggregate travels in headers (AMQP has no property for it).
func (r *RabbitMQ) publishing(msg broker.Message, token string) (exchange, key string, p amqp.Publishing) {
	// The producer's headers first, but none of the names the system
	// reserves, then the system's: until 7 December the producer's were
	// copied over the aggregate's, so a row another writer put straight
	// into the outbox could replace Sluice-Aggregate-Seq, and a CC or BCC
	// header (a string, never the list RabbitMQ reads as routing keys) made
	// the broker close the publishing channel.
	headers := make(amqp.Table, len(msg.Headers)+6)
	for k, v := range msg.Headers {
		if !broker.ReservedHeader(k) {
			headers[k] = v
		}
	}
	headers[broker.HeaderAggregateType] = msg.AggregateType
	headers[broker.HeaderAggregateID] = msg.AggregateID
	headers[broker.HeaderAggregateSeq] = strconv.FormatInt(msg.AggregateSeq, 10)
	headers[broker.HeaderEventType] = msg.EventType
	headers[headerPublishID] = token
	// A replay for one consumer goes through the default exchange straight
	// to that consumer's queue (routing key = queue name; with shards, the
	// queue of the event's shard), so no other queue sees it; mandatory
	// makes a missing queue an ErrUnroutable. The topic travels in a header,
	// since the routing key is the queue's name.
	exchange, key = r.exchange, msg.Topic
	if msg.Shards > 0 {
		key = broker.ShardToken(msg.Shards, msg.Shard) + "." + msg.Topic
		headers[broker.HeaderShard] = strconv.Itoa(msg.Shard) + "/" + strconv.Itoa(msg.Shards)
	}
	if msg.ReplayTo != "" {
		exchange, key = "", r.Queue(msg.ReplayTo)
		if msg.Shards > 0 {
			key = r.ShardQueue(msg.ReplayTo, msg.Shards, msg.Shard)
		}
		headers[headerTopic] = msg.Topic
		headers[broker.HeaderReplayTo] = msg.ReplayTo
	}
	return exchange, key, amqp.Publishing{
		MessageId:    msg.ID,
		Type:         msg.EventType,
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		Timestamp:    time.Now(),
		Headers:      headers,
		Body:         msg.Payload,
	}
}

// amqpShortString is the longest AMQP short string: routing keys, message
// ids, types and header names are short strings.
const amqpShortString = 255

// withinAMQPLimits says why the connection could not carry publishing p
// with routing key key, or nil. frameMax is the connection's negotiated
// frame size (0: no limit): the content header frame, which carries p's
// properties and headers, cannot be split, and one larger than frameMax
// makes the broker close the connection. Its size is counted as amqp091
// writes the properties publishing sets.
func withinAMQPLimits(key string, p amqp.Publishing, frameMax int) error {
	if len(key) > amqpShortString {
		return fmt.Errorf("its routing key (topic) is %d bytes, more than AMQP's %d", len(key), amqpShortString)
	}
	// class id, weight, body size, property flags; then each property set
	size := 2 + 2 + 8 + 2
	for _, f := range []struct{ what, v string }{
		{"content type", p.ContentType}, {"message id", p.MessageId}, {"type (event type)", p.Type},
	} {
		if len(f.v) > amqpShortString {
			return fmt.Errorf("its %s is %d bytes, more than AMQP's %d", f.what, len(f.v), amqpShortString)
		}
		if f.v != "" {
			size += 1 + len(f.v)
		}
	}
	if p.DeliveryMode > 0 {
		size++
	}
	if !p.Timestamp.IsZero() {
		size += 8
	}
	if len(p.Headers) > 0 {
		size += 4
		for k, v := range p.Headers {
			if len(k) > amqpShortString {
				return fmt.Errorf("its header name %.40q… is %d bytes, more than AMQP's %d", k, len(k), amqpShortString)
			}
			s, ok := v.(string)
			if !ok {
				return fmt.Errorf("its header %q is not a string", k)
			}
			size += 1 + len(k) + 1 + 4 + len(s)
		}
	}
	// A frame is its payload and 8 bytes: type, channel, size, end.
	if frameMax > 0 && size+8 > frameMax {
		return fmt.Errorf("its properties and headers take a %d-byte frame, more than the connection's frame size of %d", size+8, frameMax)
	}
	return nil
}

// confirmed waits (on wctx) for one sent message's confirm and says what
// it means; answered tells whether the broker confirmed anything else
// since the message was sent.
// counted is set when the broker's answer was counted in r.confirms.
func (r *RabbitMQ) confirmed(ctx, wctx context.Context, ch *amqp.Channel, closed *closeWatch, o sent, id string, answered func() bool, counted *bool) error {
	acked, err := r.waitConfirm(wctx, o.dc)
	if err != nil {
		if errors.Is(context.Cause(wctx), errBlocked) && ctx.Err() == nil {
			reason, _ := r.block.state()
			if reason == "" {
				reason = "unblocked since"
			}
			return fmt.Errorf("%w: RabbitMQ blocked publishing (%s; a resource alarm) before it confirmed %s, which it may deliver once unblocked",
				broker.ErrUnavailable, reason, id)
		}
		if ch.IsClosed() {
			return fmt.Errorf("%w: confirm of %s: %w", broker.ErrUnavailable, id, err)
		}
		// A confirm that did not come in time while the broker confirmed
		// nothing else is the broker's stall: a memory or disk alarm blocks
		// every publishing connection until it clears, and counted as the
		// messages' failure it dead-lettered whatever the relay tried
		// meanwhile. The message may have been queued; sent again, the
		// consumers' inboxes drop it. When other publishes were confirmed
		// meanwhile, the broker answers and this confirm is what went
		// missing: that stays the publish's failure.
		if errors.Is(err, context.DeadlineExceeded) && !answered() {
			return fmt.Errorf("%w: RabbitMQ confirmed nothing within the publish timeout (a memory or disk alarm blocks publishers, or the queue's node stalled): confirm of %s: %w",
				broker.ErrUnavailable, id, err)
		}
		return fmt.Errorf("broker: confirm of %s: %w", id, err)
	}
	if !acked && ch.IsClosed() {
		// The client resolves the confirms still pending on a channel
		// that closes as not acknowledged, before or without any answer
		// of the broker's: read as the broker's nack ("a queue is full"),
		// a connection cut with a window in flight looked like a full
		// queue. The outcome is unknown: the message may be enqueued, and
		// is sent again later (the consumers' inboxes drop a duplicate).
		reason := closed.why()
		if reason == "" {
			reason = "no reason given"
		}
		return fmt.Errorf("%w: RabbitMQ's answer to %s is unknown: the publishing channel closed before it came (%s); the message may be enqueued",
			broker.ErrUnavailable, id, reason)
	}
	r.confirms.Add(1)
	*counted = true
	if !acked {
		// RabbitMQ nacks only for itself, never for the message: a queue
		// the message routes to is full with x-overflow reject-publish (a
		// consumer far behind), or the queue's process failed. Every
		// consumer queue binds every topic, so the next message meets the
		// same refusal. As a failure of this message it spent attempts and
		// dead-lettered whatever the relay tried while the queue was full;
		// as ErrUnavailable the relay pauses and the backlog waits in the
		// outbox until the queue has room.
		return fmt.Errorf("%w: RabbitMQ refused (nack) %s: a queue it routes to is full (x-overflow reject-publish) or failed", broker.ErrUnavailable, id)
	}
	r.mu.Lock()
	r.drainReturnsLocked()
	unroutable := r.waiting[o.token]
	r.mu.Unlock()
	if unroutable {
		return fmt.Errorf("%w: exchange %q, routing key %s", ErrUnroutable, o.exchange, o.key)
	}
	return nil
}

// ErrQueueNotSingleActive reports a consumer's queue declared without
// single active consumer, as Sluice declared it until 7 December. Two
// consumers of such a queue lost effects: while one retried seq k of an
// aggregate in place (broker.HandleInPlace), the other took seq k+1, and
// the inbox then dropped seq k as stale. RabbitMQ cannot change a queue's
// arguments in place, so the queue must be drained and deleted once
// (README, "RabbitMQ consumers").
var ErrQueueNotSingleActive = errors.New("broker: the consumer's queue was declared without single active consumer")

// singleActiveConsumer makes RabbitMQ deliver a queue to one consumer at a
// time and, when that consumer goes, hand the queue (its unacknowledged
// messages requeued in order first) to the next. A prefetch of one (Qos)
// bounds each channel, not the queue: without it, every process consuming
// one name (a second replica, a rolling restart's new process, a standby)
// took the next message while the first retried its own.
var singleActiveConsumer = amqp.Table{"x-single-active-consumer": true}

// DeclareQueue declares consumer's durable queue bound to every topic of the
// exchange, single-active-consumer. Subscribe does it too; call it first
// when publishing may start before the consumer does (mandatory publishes
// to no queue are refused). A queue of that name declared without single
// active consumer is ErrQueueNotSingleActive.
func (r *RabbitMQ) DeclareQueue(consumer string) error {
	if err := broker.ValidateConsumer(consumer); err != nil {
		return err
	}
	return r.onSideChannel(func(conn *amqp.Connection, ch *amqp.Channel) error { return r.declareQueue(conn, ch, consumer) })
}

func (r *RabbitMQ) declareQueue(conn *amqp.Connection, ch *amqp.Channel, consumer string) error {
	q := r.Queue(consumer)
	if _, err := ch.QueueDeclare(q, true, false, false, false, singleActiveConsumer); err != nil {
		if declaredWithoutSingleActive(conn, q, err) {
			return fmt.Errorf("%w: queue %s. Stop publishing into it (stop the relays, or console outbox pause every topic), "+
				"let one consumer of the previous release drain it to 0 messages, stop it, delete the queue "+
				"(rabbitmqctl delete_queue %s), start console consume again (it declares the queue anew), then the relays "+
				"(README, RabbitMQ consumers): %w", ErrQueueNotSingleActive, q, q, err)
		}
		return fmt.Errorf("broker: declare queue %s: %w", q, err)
	}
	if err := ch.QueueBind(q, "#", r.exchange, false, nil); err != nil {
		return fmt.Errorf("broker: bind queue %s: %w", q, err)
	}
	return nil
}

// Subscribe consumes consumer's durable queue one message at a time, and
// only while RabbitMQ makes this subscriber the queue's single active
// consumer (so per-aggregate order is kept however many processes consume
// one name: the others wait as standbys), until ctx ends, reconnecting
// after a lost connection. A queue declared without single active consumer
// (ErrQueueNotSingleActive) is refused at once. Each failure to consume
// (no connection, queue declaration refused, session cut) is logged and
// followed by a pause, 500ms doubling to 30s; a session that got as far as
// consuming resets both the pause and the count. After Options.MaxConsumeFailures failures in a row Subscribe
// returns the last one, so the consumer stops visibly (the console's
// consume subcommand exits non-zero) instead of retrying in silence.
func (r *RabbitMQ) Subscribe(ctx context.Context, consumer string, h broker.Handler) error {
	if err := broker.ValidateConsumer(consumer); err != nil {
		return err
	}
	// A queue an earlier release declared stays as it is whatever the
	// retries: say so at start rather than after MaxConsumeFailures tries
	// (or never, with retries unbounded). Any other failure here is the
	// first session's to meet and report.
	if err := r.DeclareQueue(consumer); errors.Is(err, ErrQueueNotSingleActive) {
		return err
	}
	return broker.RetryConsume(ctx, r.log, r.maxFailures, "RabbitMQ", "queue", r.Queue(consumer), func(ctx context.Context) (bool, error) {
		consumed, err := r.consume(ctx, consumer, h)
		if err == nil {
			err = errDeliveriesClosed
		}
		return consumed, err
	})
}

// consume runs one consume session on a channel of its own until ctx ends
// (nil), the broker or the connection ends it (nil, consumed), or a step
// fails (its error). consumed reports that the session got as far as
// consuming, so its end is not a failure to start.
func (r *RabbitMQ) consume(ctx context.Context, consumer string, h broker.Handler) (consumed bool, err error) {
	r.mu.Lock()
	if _, err := r.channelLocked(); err != nil {
		r.mu.Unlock()
		return false, err
	}
	conn := r.conn
	ch, err := conn.Channel()
	r.mu.Unlock()
	if err != nil {
		return false, fmt.Errorf("broker: open channel: %w", err)
	}
	defer ch.Close()
	if err := r.declareQueue(conn, ch, consumer); err != nil {
		return false, err
	}
	if err := ch.Qos(1, 0, false); err != nil {
		return false, fmt.Errorf("broker: qos: %w", err)
	}
	// Plain Consume with our own tag, cancelled by us before the channel
	// closes: ConsumeWithContext cancels from a goroutine of its own, and a
	// Cancel racing our Close on one channel can leave Close waiting forever.
	tag := "sluice-" + consumer + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	deliveries, err := ch.Consume(r.Queue(consumer), tag, false, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("broker: consume %s: %w", r.Queue(consumer), err)
	}
	for {
		select {
		case <-ctx.Done():
			_ = ch.Cancel(tag, false)
			// Hand back what was prefetched; the channel's close requeues it too.
			for d := range deliveries {
				_ = d.Nack(false, true)
			}
			return true, nil
		case d, ok := <-deliveries:
			if !ok {
				return true, nil
			}
			if herr := broker.HandleInPlace(ctx, h, fromAMQP(d), nil); herr != nil {
				// Stopped while the effect was failing: back to the queue.
				_ = d.Nack(false, true)
				continue
			}
			if err := d.Ack(false); err != nil {
				return true, fmt.Errorf("broker: ack: %w", err)
			}
		}
	}
}

// fromAMQP reads a delivery back. What the system decides comes from what
// only the system sets: the event id is the MessageId property, a replay's
// topic and target count only on a message that came through the default
// exchange (where publishing sends a replay for one consumer), and the
// shard only when the routing key carries its tokens. A message queued before
// producers' reserved headers were dropped on publish then still reads as
// the system sent it; such headers are never handed on as the producer's.
func fromAMQP(d amqp.Delivery) broker.Message {
	str := func(k string) string {
		s, _ := d.Headers[k].(string)
		return s
	}
	seq, _ := strconv.ParseInt(str(broker.HeaderAggregateSeq), 10, 64)
	msg := broker.Message{
		ID:            d.MessageId,
		Topic:         d.RoutingKey,
		AggregateType: str(broker.HeaderAggregateType),
		AggregateID:   str(broker.HeaderAggregateID),
		AggregateSeq:  seq,
		EventType:     d.Type,
		Payload:       d.Body,
	}
	shard, shards := 0, 0
	a, b, sharded := strings.Cut(str(broker.HeaderShard), "/")
	if sharded {
		shard, _ = strconv.Atoi(a)
		shards, _ = strconv.Atoi(b)
	}
	switch token := broker.ShardToken(shards, shard) + "."; {
	case d.Exchange == "":
		// A replay for one consumer, sent straight to its queue: the
		// routing key is the queue's name.
		if t := str(headerTopic); t != "" {
			msg.Topic = t
		}
		msg.ReplayTo = str(broker.HeaderReplayTo)
		if sharded {
			msg.Shard, msg.Shards = shard, shards
		}
	case sharded && strings.HasPrefix(msg.Topic, token):
		// The routing key's shard tokens are not the topic.
		msg.Shard, msg.Shards = shard, shards
		msg.Topic = strings.TrimPrefix(msg.Topic, token)
	}
	for k, v := range d.Headers {
		if broker.ReservedHeader(k) {
			continue
		}
		if s, ok := v.(string); ok {
			if msg.Headers == nil {
				msg.Headers = map[string]string{}
			}
			msg.Headers[k] = s
		}
	}
	return msg
}

// DeleteShardQueues removes the shard queues of consumer (tests and the
// bench clean up with it).
func (r *RabbitMQ) DeleteShardQueues(consumer string, shards int) error {
	return r.onSideChannel(func(_ *amqp.Connection, ch *amqp.Channel) error {
		for s := range shards {
			if _, err := ch.QueueDelete(r.ShardQueue(consumer, shards, s), false, false, false); err != nil {
				return fmt.Errorf("broker: delete queue %s: %w", r.ShardQueue(consumer, shards, s), err)
			}
		}
		return nil
	})
}

// ShardQueue is the durable queue of one shard of a consumer.
func (r *RabbitMQ) ShardQueue(consumer string, shards, shard int) string {
	return r.exchange + "." + consumer + "." + broker.ShardToken(shards, shard)
}

// DeclareShardQueues declares the queues of every shard of consumer, each
// single-active-consumer and bound to its shard's routing keys. Call it
// before relays publish sharded events (mandatory publishes to no queue
// are refused); inbox.ShardedConsumer does at start.
func (r *RabbitMQ) DeclareShardQueues(consumer string, shards int) error {
	if err := broker.ValidateConsumer(consumer); err != nil {
		return err
	}
	return r.onSideChannel(func(_ *amqp.Connection, ch *amqp.Channel) error {
		for s := range shards {
			if err := r.declareShardQueue(ch, consumer, shards, s); err != nil {
				return err
			}
		}
		return nil
	})
}

func (r *RabbitMQ) declareShardQueue(ch *amqp.Channel, consumer string, shards, shard int) error {
	q := r.ShardQueue(consumer, shards, shard)
	// Single active consumer: RabbitMQ delivers the queue to one consumer
	// at a time and, when it goes, hands the queue (its unacknowledged
	// messages requeued in order first) to the next.
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-single-active-consumer": true}); err != nil {
		return fmt.Errorf("broker: declare queue %s: %w", q, err)
	}
	if err := ch.QueueBind(q, broker.ShardToken(shards, shard)+".#", r.exchange, false, nil); err != nil {
		return fmt.Errorf("broker: bind queue %s: %w", q, err)
	}
	return nil
}

// batchLinger is how long a shard's batch waits for one more delivery
// before it is handed over: deliveries already received come one after
// another well within it, and a shard with nothing more to read pays it
// once per batch.
const batchLinger = time.Millisecond

// SubscribeShard consumes one shard's queue with a prefetch of s.Batch and
// hands h what has arrived, at most s.Batch messages at a time. A batch h
// accepts is acknowledged at once (multiple ack of its last delivery); a
// batch h refuses is handed back whole (multiple nack with requeue, which
// puts the messages back in their places) and SubscribeShard returns h's
// error. s.After is ignored: the queue itself is the position.
func (r *RabbitMQ) SubscribeShard(ctx context.Context, s broker.ShardSubscription, h broker.BatchHandler) error {
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
	r.mu.Lock()
	if _, err := r.channelLocked(); err != nil {
		r.mu.Unlock()
		return err
	}
	ch, err := r.conn.Channel()
	r.mu.Unlock()
	if err != nil {
		return fmt.Errorf("broker: open channel: %w", err)
	}
	defer ch.Close()
	if err := r.declareShardQueue(ch, s.Consumer, s.Shards, s.Shard); err != nil {
		return err
	}
	if err := ch.Qos(size, 0, false); err != nil {
		return fmt.Errorf("broker: qos: %w", err)
	}
	queue := r.ShardQueue(s.Consumer, s.Shards, s.Shard)
	tag := "sluice-" + s.Consumer + "-" + strconv.Itoa(s.Shard) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	deliveries, err := ch.Consume(queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("broker: consume %s: %w", queue, err)
	}
	batch := make([]broker.Message, 0, size)
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	defer linger.Stop()
	for {
		batch = batch[:0]
		var last uint64
		select {
		case <-ctx.Done():
			_ = ch.Cancel(tag, false)
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return fmt.Errorf("broker: consume %s: %w", queue, errDeliveriesClosed)
			}
			batch = append(batch, fromAMQP(d))
			last = d.DeliveryTag
		}
		// The client hands deliveries over from its own goroutine through
		// an unbuffered channel: right after a receive the next one is
		// rarely offered yet, though it has arrived. Without waiting for
		// it, every batch held one message (a transaction per event); so
		// the batch takes what comes within batchLinger of the one before.
	fill:
		for len(batch) < size {
			var (
				d  amqp.Delivery
				ok bool
			)
			select {
			case d, ok = <-deliveries:
			default:
				linger.Reset(batchLinger)
				select {
				case d, ok = <-deliveries:
					// Since Go 1.23 a stopped timer delivers no stale
					// value: no drain (which could block).
					linger.Stop()
				case <-linger.C:
					break fill
				}
			}
			if !ok {
				break fill
			}
			batch = append(batch, fromAMQP(d))
			last = d.DeliveryTag
		}
		if herr := h(ctx, batch); herr != nil {
			_ = ch.Nack(last, true, true)
			return herr
		}
		if err := ch.Ack(last, true); err != nil {
			return fmt.Errorf("broker: ack: %w", err)
		}
	}
}

// closeTimeout bounds the close handshake: a connection RabbitMQ blocks (a
// resource alarm) is not read by the server, so its close-ok never comes
// while the alarm lasts, and a relay stopped then never exited.
const closeTimeout = 5 * time.Second

// Close closes the connection, waiting up to closeTimeout for the broker's
// answer; the connection is closed either way.
func (r *RabbitMQ) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn != nil && !r.conn.IsClosed() {
		return r.conn.CloseDeadline(time.Now().Add(closeTimeout))
	}
	return nil
}

// DeleteQueue removes consumer's queue, keeping the exchange (tests and the
// bench clean up with it).
func (r *RabbitMQ) DeleteQueue(consumer string) error {
	return r.onSideChannel(func(_ *amqp.Connection, ch *amqp.Channel) error {
		if _, err := ch.QueueDelete(r.Queue(consumer), false, false, false); err != nil {
			return fmt.Errorf("broker: delete queue %s: %w", r.Queue(consumer), err)
		}
		return nil
	})
}

// DeleteNamespace removes the exchange and the queues of consumers (tests
// and the demo clean up after themselves with it).
func (r *RabbitMQ) DeleteNamespace(consumers ...string) error {
	return r.onSideChannel(func(_ *amqp.Connection, ch *amqp.Channel) error {
		for _, c := range consumers {
			if _, err := ch.QueueDelete(r.Queue(c), false, false, false); err != nil {
				return fmt.Errorf("broker: delete queue %s: %w", r.Queue(c), err)
			}
		}
		if err := ch.ExchangeDelete(r.exchange, false, false); err != nil {
			return fmt.Errorf("broker: delete exchange %s: %w", r.exchange, err)
		}
		return nil
	})
}

// onSideChannel runs fn on a channel of its own (declarations and deletions
// that fail close their channel, so they never use the publishing one),
// under the lock and on a live connection.
func (r *RabbitMQ) onSideChannel(fn func(conn *amqp.Connection, ch *amqp.Channel) error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.channelLocked(); err != nil {
		return err
	}
	ch, err := r.conn.Channel()
	if err != nil {
		return fmt.Errorf("broker: open channel: %w", err)
	}
	defer ch.Close()
	return fn(r.conn, ch)
}

// declaredWithoutSingleActive says whether err, the refusal of queue q's
// single-active-consumer declaration, is because q exists as earlier
// releases declared it: durable, without arguments. RabbitMQ refuses a
// declaration whose arguments differ from the queue's (406
// PRECONDITION_FAILED), in either direction, so declaring q as it used to
// be succeeds only on such a queue; any other difference (not durable,
// other arguments) fails that too, and the first error stands. The refusal
// closed the declaring channel: the probe takes a channel of its own.
func declaredWithoutSingleActive(conn *amqp.Connection, q string, err error) bool {
	var aerr *amqp.Error
	if !errors.As(err, &aerr) || aerr.Code != amqp.PreconditionFailed {
		return false
	}
	ch, cerr := conn.Channel()
	if cerr != nil {
		return false
	}
	defer ch.Close()
	_, perr := ch.QueueDeclare(q, true, false, false, false, nil)
	return perr == nil
}
