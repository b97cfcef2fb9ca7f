package live

import (
	"bytes"
	"context"

	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// Fragment is one rendered piece of a live page, swapped by id.
type Fragment struct {
	// Page is the page whose sockets receive it: PageDashboard ("") or
	// another page's name (PageJobs). A socket subscribes to one page.
	Page string
	ID   string
	HTML []byte
}

// Live pages: each socket receives its own page's fragments only.
const (
	PageDashboard = ""
	PageJobs      = "jobs"
	PageAudit     = "audit"     // the audit pages: the chain's verification state
	PageApprovals = "approvals" // the approvals page: a signal to reload its list
	// PageOutbox is the outbox list: no fragment, but an empty message on
	// subscribe and on every tick, after which its socket compares the
	// newest snapshot with the page's own (web/outbox_live.go).
	PageOutbox = "outbox"
	// PageRecord is a detail page watching the record it shows
	// (SubscribeRecord): no fragment, but an empty message on subscribe and
	// on every tick, after which its socket compares the record's newest
	// state (Record) with its page's (web/record_live.go).
	PageRecord = "record"
)

// RenderFunc renders the dashboard's live fragments (out-of-band swaps) for
// the current snapshot and the history (scalar figures only, see History). The web layer provides it, with the
// same components the page uses: domain packages never import views.
type RenderFunc func(cur Snapshot, history []Snapshot) ([]Fragment, error)

// CloseReason says why the hub closed a client.
type CloseReason int

// Reasons a client is closed.
const (
	ClosedByClient CloseReason = iota // the socket went away
	ClosedSlow                        // its buffer was full: dropped, it may reconnect
	ClosedSession                     // its session ended (logout, expiry, role loss)
	ClosedShutdown                    // the process is stopping
)

// SnapshotTimeout bounds one tick's reads; a tick that cannot read in time
// fails, and the feed marks its figures as from before (Unreachable).
const SnapshotTimeout = 10 * time.Second

// Defaults of Config, applied to zero fields (`console serve --live-tick`
// shows DefaultInterval as its default).
const (
	DefaultInterval     = time.Second
	DefaultMinInterval  = 250 * time.Millisecond
	DefaultHistory      = time.Hour
	DefaultClientBuffer = 8
)

// Config of a feed.
type Config struct {
	Interval     time.Duration // tick (default 1s)
	MinInterval  time.Duration // NOTIFY wakes are rate-limited to this (default 250ms)
	History      time.Duration // sparkline window (default 1h)
	ClientBuffer int           // messages queued per client before it is dropped (default 8)
	Render       RenderFunc
	Logger       *slog.Logger
	Now          func() time.Time // this process's clock (default time.Now): the snapshot's age
	ReadTimeout  time.Duration    // bounds one tick's reads (default SnapshotTimeout)
}

// Client is one subscribed browser.
type Client struct {
	session string
	page    string
	watch   *Watch // the record its page watches; nil: none, or beyond MaxWatched
	send    chan []byte
	done    chan struct{}
	once    sync.Once
	reason  atomic.Int32
}

// Messages are the bytes to write to the socket, in order.
func (c *Client) Messages() <-chan []byte { return c.send }

// Done is closed when the hub drops the client.
func (c *Client) Done() <-chan struct{} { return c.done }

// Reason is why Done was closed.
func (c *Client) Reason() CloseReason { return CloseReason(c.reason.Load()) }

func (c *Client) close(r CloseReason) {
	c.once.Do(func() {
		c.reason.Store(int32(r))
		close(c.done)
	})
}

// Feed is the process's one live feed.
type Feed struct {
	q      Querier
	listen *pgxpool.Pool
	cfg    Config
	log    *slog.Logger

	queries       atomic.Int64 // snapshot statements run
	ticks         atomic.Int64
	recordQueries atomic.Int64 // watched records' statements run (ReadRecords)

	poke chan struct{} // Poke: read a snapshot soon

	// cursor carries the backlog's head walk from tick to tick, so a topic's
	// head is not walked through the entries its published events left
	// (outbox.BacklogCursor).
	cursor outbox.BacklogCursor

	mu        sync.Mutex
	latest    Snapshot
	haveFirst bool
	started   time.Time // when the feed was made (this process's clock)
	readAt    time.Time // when latest was read (this process's clock)
	failSince time.Time // when snapshots began to fail (zero: the last one was read)
	ring      []Snapshot
	frags     map[fragKey][]byte // last rendered HTML per page and fragment id
	order     []fragKey          // the last render's fragments, in order
	clients   map[*Client]struct{}
	dropped   int64
	watched   watchSet              // the records sockets watch, with their counts
	records   map[Watch]RecordState // their states as last read
	refused   int64                 // watches beyond MaxWatched
}

type fragKey struct{ page, id string }

// New builds a feed reading snapshots through q. listen (may be nil) is the
// pool a dedicated LISTEN connection is taken from, and the outbox's backlog
// counts are compacted through (nil: not by this feed; the relays do).
func New(q Querier, listen *pgxpool.Pool, cfg Config) *Feed {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.MinInterval <= 0 {
		cfg.MinInterval = DefaultMinInterval
	}
	if cfg.History <= 0 {
		cfg.History = DefaultHistory
	}
	if cfg.ClientBuffer <= 0 {
		cfg.ClientBuffer = DefaultClientBuffer
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = SnapshotTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Feed{q: q, listen: listen, cfg: cfg, log: cfg.Logger, frags: map[fragKey][]byte{},
		clients: map[*Client]struct{}{}, poke: make(chan struct{}, 1), watched: watchSet{}, records: map[Watch]RecordState{},
		started: cfg.Now()}
}

// Run polls until ctx ends, then closes every client.
func (f *Feed) Run(ctx context.Context) error {
	defer f.closeAll(ClosedShutdown)
	// Writers of outbox events poke db.OutboxChannel after committing: the
	// dashboard then shows a new backlog before the next tick.
	var wake <-chan struct{} // nil: never ready, tick only
	if f.listen != nil {
		l := db.NewListener(f.listen, db.OutboxChannel, f.log)
		var wg sync.WaitGroup
		wg.Go(func() { l.Run(ctx) })
		defer wg.Wait()
		wake = l.Wake()
	}
	if f.listen != nil {
		var wg sync.WaitGroup
		wg.Go(func() { f.compactCounts(ctx) })
		defer wg.Wait()
	}
	t := time.NewTicker(f.cfg.Interval)
	defer t.Stop()
	var (
		last    time.Time
		failing time.Time // since when steps fail (zero: they do not)
	)
	for {
		// Logged when reads begin to fail, at the error level the demo
		// and a quiet LOG_LEVEL still show (the dashboard then points to
		// the log), and when they work again; the failures in between at
		// debug, not one warning a tick for the outage's length.
		switch err := f.Step(ctx); {
		case err != nil && ctx.Err() == nil && failing.IsZero():
			failing = time.Now()
			f.log.Error("live: cannot read the snapshot; the dashboard marks its figures as from before", "err", err)
		case err != nil && ctx.Err() == nil:
			f.log.Debug("live: cannot read the snapshot", "err", err)
		case err == nil && !failing.IsZero():
			f.log.Info("live: the snapshot reads again", "after", time.Since(failing).Round(time.Millisecond))
			failing = time.Time{}
		}
		last = time.Now()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-f.poke:
		case <-wake:
		}
		// Whatever woke the poller (the tick, a NOTIFY, a Poke), never
		// poll more often than MinInterval: NOTIFY serializes commits and
		// can come in floods.
		if wait := f.cfg.MinInterval - time.Since(last); wait > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
		}
		t.Reset(f.cfg.Interval)
	}
}

// CompactInterval is how often a running feed compacts the outbox's backlog
// counts.
const CompactInterval = 10 * time.Second

// compactCounts collapses the outbox's backlog count deltas every
// CompactInterval (outbox.CompactBacklogCounts), so the snapshot's sum over
// them stays a few rows per topic even when no relay runs (producers add a
// delta row per insert statement; relays compact too, after publishing). It
// is its own statement on its own timer, through the listen pool, never part
// of the one snapshot statement per tick.
func (f *Feed) compactCounts(ctx context.Context) {
	t := time.NewTicker(CompactInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := outbox.CompactBacklogCounts(ctx, f.listen); err != nil && ctx.Err() == nil {
			f.log.Warn("live: compact outbox backlog counts", "err", err)
		}
	}
}

// Poke asks for a snapshot before the next tick (rate-limited like a
// NOTIFY wake); it never blocks. The console's job runner pokes after each
// chunk, so progress shows as it happens.
func (f *Feed) Poke() {
	select {
	case f.poke <- struct{}{}:
	default:
	}
}

// Step reads one snapshot, records it, and pushes the changed fragments.
func (f *Feed) Step(ctx context.Context) error {
	f.mu.Lock()
	prev := f.latest.At
	events, pays := f.watched.ids(KindEvent), f.watched.ids(KindPayment)
	f.mu.Unlock()
	f.queries.Add(1)
	// Bounded: a read that waits for ever (a pool whose every connection
	// waits on a lock) would leave the last figures standing as current,
	// never marked (a review held the pool's one connection: the gauges
	// stayed, the page said nothing).
	rctx, cancel := context.WithTimeout(ctx, f.cfg.ReadTimeout)
	defer cancel()
	s, err := ReadSnapshot(rctx, f.q, prev, &f.cursor)
	if err != nil {
		f.unreachable(ctx)
		return err
	}
	// The watched records: one more statement, only when a socket watches
	// one. Failing, the states read before stay (each true as of its read,
	// which the sockets compare by time), and the snapshot still goes out.
	var records map[Watch]RecordState
	if len(events)+len(pays) > 0 {
		f.recordQueries.Add(1)
		if records, err = ReadRecords(rctx, f.q, events, pays); err != nil && ctx.Err() == nil {
			f.log.Warn("live: read the watched records", "err", err)
		}
	} else {
		records = map[Watch]RecordState{}
	}
	f.ticks.Add(1)
	f.mu.Lock()
	f.latest, f.haveFirst, f.readAt, f.failSince = s, true, f.cfg.Now(), time.Time{}
	if records != nil {
		f.records = records
	}
	// The ring keeps only the scalar figures the sparklines draw: an hour
	// of full snapshots would hold every topic's backlog and both recent
	// lists thousands of times, memory that grows with the number of topics.
	point := s
	point.Backlog, point.RecentDead, point.RecentUnknown, point.Jobs, point.Paused = nil, nil, nil, nil, nil
	point.Chain.Latest, point.Chain.LastVerified = nil, nil
	f.ring = append(f.ring, point)
	cut := 0
	for cut < len(f.ring) && s.At.Sub(f.ring[cut].At) > f.cfg.History {
		cut++
	}
	if cut > 0 {
		f.ring = append(f.ring[:0:0], f.ring[cut:]...)
	}
	hist := append([]Snapshot(nil), f.ring...)
	f.mu.Unlock()
	return f.push(s, hist)
}

// unreachable records that the database did not answer a snapshot: from the
// first failure on, Latest marks the last figures read as from before it,
// and the pages get them so marked once. Without it the dashboard and
// /metrics went on showing the last figures as current through a
// 40-second outage (an outage drill), the connection indicator "live".
func (f *Feed) unreachable(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	f.mu.Lock()
	first := f.failSince.IsZero()
	if first {
		f.failSince = f.cfg.Now()
	}
	s, have := f.latest, f.haveFirst
	s.Unreachable = f.failSince
	hist := append([]Snapshot(nil), f.ring...)
	f.mu.Unlock()
	if first && have {
		if err := f.push(s, hist); err != nil {
			f.log.Warn("live: render the unreachable state", "err", err)
		}
	}
}

// push renders s's fragments once, whatever the number of clients, and
// sends each client its page's changed ones.
func (f *Feed) push(s Snapshot, hist []Snapshot) error {
	if f.cfg.Render == nil {
		return nil
	}
	frags, err := f.cfg.Render(s, hist)
	if err != nil {
		return err
	}
	msgs := map[string]*bytes.Buffer{} // per page: the changed fragments
	f.mu.Lock()
	defer f.mu.Unlock()
	f.order = f.order[:0]
	seen := make(map[fragKey]bool, len(frags))
	for _, fr := range frags {
		k := fragKey{fr.Page, fr.ID}
		f.order = append(f.order, k)
		seen[k] = true
		if !bytes.Equal(f.frags[k], fr.HTML) {
			if msgs[fr.Page] == nil {
				msgs[fr.Page] = &bytes.Buffer{}
			}
			msgs[fr.Page].Write(fr.HTML)
			f.frags[k] = fr.HTML
		}
	}
	// Fragments come and go (a job's progress): forget those no longer
	// rendered, so memory follows what is shown.
	for k := range f.frags {
		if !seen[k] {
			delete(f.frags, k)
		}
	}
	for c := range f.clients {
		var msg []byte
		switch {
		case msgs[c.page] != nil:
			msg = msgs[c.page].Bytes()
		case c.page == PageOutbox, c.page == PageRecord:
			msg = []byte{} // a snapshot was read: the tick itself is the news
		default:
			continue
		}
		select {
		case c.send <- msg:
		default:
			// A slow client is dropped, never buffered without bound; its
			// browser reconnects and gets the full state again.
			f.remove(c)
			f.dropped++
			c.close(ClosedSlow)
		}
	}
	return nil
}

// Subscribe adds a dashboard client for the session with this id hash.
// Its first message is the full current state.
func (f *Feed) Subscribe(sessionHash string) *Client {
	return f.SubscribePage(sessionHash, PageDashboard)
}

// SubscribePage adds a client of page for the session with this id hash:
// it receives that page's fragments only, the full current state first
// (PageOutbox: an empty message, once a snapshot has been read).
func (f *Feed) SubscribePage(sessionHash, page string) *Client {
	return f.subscribe(sessionHash, page, nil)
}

// SubscribeRecord adds a client of a detail page (PageRecord) watching the
// record w: from the next tick the feed reads w's state with the other
// watched records, and Record returns it. A record beyond MaxWatched of its
// kind is not watched: the client still gets its ticks, and Record nothing.
func (f *Feed) SubscribeRecord(sessionHash string, w Watch) *Client {
	return f.subscribe(sessionHash, PageRecord, &w)
}

func (f *Feed) subscribe(sessionHash, page string, w *Watch) *Client {
	c := &Client{session: sessionHash, page: page, send: make(chan []byte, f.cfg.ClientBuffer), done: make(chan struct{})}
	f.mu.Lock()
	defer f.mu.Unlock()
	if w != nil {
		if f.watched.add(*w) {
			c.watch = w
		} else {
			f.refused++
		}
	}
	var full bytes.Buffer
	for _, k := range f.order {
		if k.page == page {
			full.Write(f.frags[k])
		}
	}
	if full.Len() > 0 || ((page == PageOutbox || page == PageRecord) && f.haveFirst) {
		c.send <- full.Bytes()
	}
	f.clients[c] = struct{}{}
	return c
}

// Unsubscribe removes a client (its socket closed).
func (f *Feed) Unsubscribe(c *Client) {
	f.mu.Lock()
	f.remove(c)
	f.mu.Unlock()
	c.close(ClosedByClient)
}

// CloseSession closes every socket of a session (logout).
func (f *Feed) CloseSession(sessionHash string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for c := range f.clients {
		if c.session == sessionHash {
			f.remove(c)
			c.close(ClosedSession)
			n++
		}
	}
	return n
}

func (f *Feed) closeAll(r CloseReason) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.clients {
		f.remove(c)
		c.close(r)
	}
}

// remove forgets a client and its watch (f.mu held). Only a client still
// subscribed gives its watch back, so a client removed twice (dropped as
// slow, then unsubscribed by its socket) counts once.
func (f *Feed) remove(c *Client) {
	if _, ok := f.clients[c]; !ok {
		return
	}
	delete(f.clients, c)
	if c.watch != nil {
		f.watched.remove(*c.watch)
	}
}

// Record is the newest state read of the record the client watches, false
// when it watches none (beyond MaxWatched) or none has been read yet.
func (f *Feed) Record(c *Client) (RecordState, bool) {
	if c.watch == nil {
		return RecordState{}, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.records[*c.watch]
	return s, ok
}

// Watching reports whether the client's record is watched (false: none
// asked, or beyond MaxWatched).
func (c *Client) Watching() bool { return c.watch != nil }

// WatchStats are the watched records' counters: statements run, records
// watched now per kind, and watches refused beyond MaxWatched.
func (f *Feed) WatchStats() (queries int64, watched map[string]int, refused int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	watched = map[string]int{}
	for kind, ids := range f.watched {
		watched[kind] = len(ids)
	}
	return f.recordQueries.Load(), watched, f.refused
}

// Latest is the newest snapshot (false before the first).
func (f *Feed) Latest() (Snapshot, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.latest
	s.Unreachable = f.failSince
	return s, f.haveFirst
}

// staleAfter is how old the latest snapshot may be before /metrics leaves
// its gauges out: StaleAfter, or three ticks and a read's timeout when the
// feed is set slower, so a healthy feed never loses its gauges between two
// ticks, nor over one read that timed out.
func (f *Feed) staleAfter() time.Duration {
	return max(StaleAfter, f.cfg.ReadTimeout+3*f.cfg.Interval)
}

// Age is how long ago (this process's clock) the latest snapshot was read,
// or, before the first, since the feed was made; false before the first.
func (f *Feed) Age() (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.haveFirst {
		return f.cfg.Now().Sub(f.started), false
	}
	return f.cfg.Now().Sub(f.readAt), true
}

// History is the snapshots of the last hour, oldest first, with their
// scalar figures only (no per-topic backlog, no recent lists).
func (f *Feed) History() []Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Snapshot(nil), f.ring...)
}

// Clients is the number of subscribed clients.
func (f *Feed) Clients() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.clients)
}

// Queued is the number of messages waiting in client buffers: at most
// ClientBuffer per client, since a client whose buffer is full is dropped.
func (f *Feed) Queued() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for c := range f.clients {
		n += len(c.send)
	}
	return n
}

// Dropped is the number of slow clients dropped so far.
func (f *Feed) Dropped() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dropped
}

// Stats are the feed's own counters (tests check the fan-out cost with them).
func (f *Feed) Stats() (queries, ticks int64) { return f.queries.Load(), f.ticks.Load() }
