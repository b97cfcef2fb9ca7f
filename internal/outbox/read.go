package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/db"
)

// The outbox's numbers, each with one definition that the dashboard,
// /metrics, the demo's status line and the list pages share. They are
// db.Read parts: read alone (ReadBacklog) or composed with other rooms' parts
// into the console's one snapshot statement per tick.

// TopicBacklog is the unfinished work of one topic.
type TopicBacklog struct {
	Topic    string `json:"topic"`
	Pending  int64  `json:"pending"`   // status pending, in flight included
	InFlight int64  `json:"in_flight"` // of those, under a live lease among the first BacklogHead in claim order
}

// BacklogHead is how many of a topic's pending events, in claim order, the
// backlog reads for InFlight and OldestPendingAge.
const BacklogHead = 1000

// Backlog is the state of the outbox's unfinished work.
//
// Pending counts every event whose status is pending: waiting, backing off
// or in flight (a relay holds it under a live lease). It is exact, read from
// the backlog counts (outbox_backlog_count, kept on every write), not by
// counting events. This is what sluice_outbox_backlog{topic} reports and what
// the dashboard calls the backlog. Dead is exact the same way.
//
// InFlight is, per topic, the pending events under a live lease among the
// topic's first BacklogHead (1,000) pending events in claim order (id
// order). Relays lease in claim order, so in-flight events are at the head:
// the figure is exact unless a topic has more than 1,000 pending events
// ahead of a leased one (ordering holds back later events of an aggregate,
// a relay passes over them), and then it is a lower bound. Reading the head
// only keeps the read O(topics), whatever the backlog.
//
// OldestPendingAge is now() − the oldest created_at among each topic's first
// BacklogHead pending events in claim order, the oldest over the topics.
// Ids are UUIDv7 made by Insert (the inserting process's clock) and
// created_at is the inserting transaction's start (now()), so claim order
// is creation order up to the length of a transaction and the clock skew
// between producers; the head covers that.
type Backlog struct {
	Topics           []TopicBacklog `json:"topics"` // largest first
	Pending          int64          `json:"pending"`
	InFlight         int64          `json:"in_flight"`
	OldestPendingAge time.Duration  `json:"-"`      // see Backlog
	Dead             int64          `json:"dead"`   // dead letters waiting for an operator
	Paused           []TopicPause   `json:"paused"` // paused topics by name (outbox_topic_pause: a handful of rows)
}

// BacklogRead reads Backlog: the counts from outbox_backlog_count (a few
// rows per topic once compacted, see CompactBacklogCounts), and, for each
// topic with pending events, its first BacklogHead pending events in claim
// order through outbox_event_pending_topic_idx (the read repeats that
// partial index's predicate, a non-empty topic, so the planner may use it;
// every topic is 1 to 200 characters). O(topics × 1,000) at most, never O(backlog).
// Lease liveness is judged on the database clock, now().
//
// A published event's entry stays in outbox_event_pending_topic_idx until
// VACUUM removes it, and a walk of a topic's head from its lowest id passes
// over every one: 21 ms per topic and tick once 106,000 events of the topic
// had been published since the last vacuum (bench/README.md, "The
// dashboard snapshot"). A reader that reads again and again (the console's
// feed, once per tick) gives a Cursor, and each topic's walk then starts
// where the topic's pending events started at its previous read
// (BacklogCursor): the same events, without the history.
//
// The head is "topic = ANY (ARRAY[t]) ORDER BY topic, id", not "topic = t
// ORDER BY id": the same rows, but a plain equality makes the topic a
// constant of the query, and the planner may then walk
// outbox_event_pending_idx in id order filtering by topic (it prices the
// topic index's heap visits as random, topics interleaving), which reads
// every pending event ahead of the topic's first: all of a paused topic's
// backlog, say. "= ANY" is still an index condition on the topic but no
// such constant, so only the (topic, id) index gives the requested order,
// and its estimate stays that of an equality (a range would be priced as
// a few rows and read through a bitmap, all of the topic, then sorted).
// internal/outbox/backlog_plan_internal_test.go keeps it so.
type BacklogRead struct {
	Backlog Backlog
	// Cursor, when set, carries each topic's walk start from one read to
	// the next; nil: every topic's head is walked from its lowest id.
	Cursor *BacklogCursor

	read cursorRead // what Expr sent, for Scan
}

// BacklogCursor is where each topic's head walk starts, carried from one
// BacklogRead to the next. The zero value is ready; it is safe for
// concurrent reads (each one's result is valid on its own).
//
// After a read, each topic's walk starts at the ids made lateCommit before
// it (UUIDv7: the writer's clock), and the topic's pending events below
// that — those that have waited longer: held behind a dead letter, backing
// off — are remembered by id, at most backlogStuck of them; a topic with
// more (a backlog) walks from its first pending event, or from the first
// after a wide gap (nextCursor). The next read probes the remembered ones
// by primary key and walks the topic's index from the start: the published
// events' entries below it are not read again.
//
// Nothing else is assumed. The counts (exact, in the same snapshot) say how
// many events of the topic are pending; when the remembered ones still
// pending and the walk together find fewer than that and fewer than
// BacklogHead, something became pending below the start (an operator's
// retry, a replay, a late commit) and the same statement walks that topic
// from its lowest id, so the head is exactly what a walk from the lowest id
// reads. Only when BacklogHead or more events of the topic wait can the
// check not tell: such a topic is walked from its lowest id every FullWalk
// (default 10 s), which bounds how long such an event is missing from
// InFlight and OldestPendingAge. A topic whose head was not full never
// needs it.
//
// The walk's start comes from the console's clock (Now) and the ids from
// the writers' clocks: an event whose id was made more than lateCommit
// before a read and committed after it lies below the start, and the count
// check finds it.
type BacklogCursor struct {
	// FullWalk is how often a topic with BacklogHead or more pending events
	// is walked from its lowest id (0: DefaultBacklogFullWalk).
	FullWalk time.Duration
	// Now is the clock that makes the walk's start (nil: time.Now).
	Now func() time.Time

	mu      sync.Mutex
	topics  map[string]topicCursor
	fullAt  time.Time // the last read that walked the full heads from their lowest id
	rewalks int64     // topics walked again from their lowest id because the counts said so (tests)
}

// DefaultBacklogFullWalk is how often a BacklogCursor walks a topic with
// BacklogHead or more pending events from its lowest id.
const DefaultBacklogFullWalk = 10 * time.Second

// backlogStuck is how many pending events below its walk's start a topic's
// cursor remembers by id (a probe each per read).
const backlogStuck = 32

type topicCursor struct {
	From  uuid.UUID   `json:"from"`            // the walk starts here
	Stuck []uuid.UUID `json:"stuck,omitempty"` // every event of the topic pending below From at the last read
	Full  bool        `json:"-"`               // the head held BacklogHead events: the count check cannot tell
}

// topicRead is what a read says of one topic for its cursor.
type topicRead struct {
	old    []uuid.UUID // the first pending ids of the head below the read's young
	head   int         // the head's events
	rewalk bool        // walked again from the lowest id: the counts said so
}

// cursorRead is what one read sent: each topic's start (a topic left out is
// walked from its lowest id), and the start of the ids the next read's
// walks start from.
type cursorRead struct {
	state []byte
	young uuid.UUID
	full  bool
	at    time.Time
}

func (c *BacklogCursor) begin() cursorRead {
	now := time.Now()
	if c.Now != nil {
		now = c.Now()
	}
	r := cursorRead{state: []byte("{}"), young: v7Before(now.Add(-lateCommit)), at: now}
	c.mu.Lock()
	defer c.mu.Unlock()
	every := c.FullWalk
	if every <= 0 {
		every = DefaultBacklogFullWalk
	}
	if c.topics == nil {
		r.full = true
		return r
	}
	state := c.topics
	if now.Sub(c.fullAt) >= every || now.Before(c.fullAt) {
		r.full = true
		state = make(map[string]topicCursor, len(c.topics))
		for topic, tc := range c.topics {
			if !tc.Full { // a full head is left out: walked from its lowest id
				state[topic] = tc
			}
		}
	}
	if b, err := json.Marshal(state); err == nil {
		r.state = b
	}
	return r
}

// stuckGap is the gap between the ids (their UUIDv7 milliseconds) of two of
// a topic's pending events below the walk's start from which the earlier
// ones are remembered by id and the walk starts at the later one.
const stuckGap = time.Second

// nextCursor is where a topic's next walk starts, from the first pending ids
// of its head below young (at most backlogStuck+1, in id order): all of
// them remembered and the walk from young; or, when there are more (a
// backlog), the walk from the first of them — the entries of the events
// published before it are what it saves — unless a gap of stuckGap or more
// in the first ones sets a few apart (a dead letter's held event days
// before the backlog): those are remembered, and the walk starts after the
// widest such gap.
func nextCursor(young uuid.UUID, old []uuid.UUID) topicCursor {
	if len(old) <= backlogStuck {
		return topicCursor{From: young, Stuck: old}
	}
	split, widest := 0, stuckGap.Milliseconds()-1
	for i := 1; i < len(old); i++ {
		if gap := v7Millis(old[i]) - v7Millis(old[i-1]); gap > widest {
			split, widest = i, gap
		}
	}
	return topicCursor{From: old[split], Stuck: old[:split]}
}

// v7Millis is the Unix milliseconds a UUIDv7 was made at.
func v7Millis(u uuid.UUID) int64 {
	var ms int64
	for _, b := range u[:6] {
		ms = ms<<8 | int64(b)
	}
	return ms
}

// moved records where each topic's next walk starts (nextCursor); topics
// without pending events start at young.
func (c *BacklogCursor) moved(r cursorRead, read map[string]topicRead) {
	next := make(map[string]topicCursor, len(read))
	rewalks := 0
	for topic, t := range read {
		tc := nextCursor(r.young, t.old)
		tc.Full = t.head >= BacklogHead
		next[topic] = tc
		if t.rewalk {
			rewalks++
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rewalks += int64(rewalks)
	if r.full {
		c.fullAt = r.at
	}
	for topic := range c.topics {
		if _, ok := next[topic]; !ok {
			next[topic] = topicCursor{From: r.young} // nothing pending: exact, in the read's snapshot
		}
	}
	c.topics = next
}

// Expr implements db.Read.
func (r *BacklogRead) Expr(args *db.Args) string {
	r.read = cursorRead{state: []byte("{}"), full: true}
	if r.Cursor != nil {
		r.read = r.Cursor.begin()
	}
	state, young := args.Add(string(r.read.state)), args.Add(r.read.young)
	head := strconv.Itoa(BacklogHead)
	stuck := strconv.Itoa(backlogStuck + 1)
	// Per topic: k, the remembered events below the walk's start still
	// pending (probes by id only: an event's topic never changes, and a
	// topic condition would let the planner read the topic's whole history
	// through its indexes); w, the walk from the start; f, the walk
	// from the lowest id, run (a one-time filter) only when k and w found
	// fewer than the counts say wait within the head.
	return `SELECT json_build_object(
	    'topics', coalesce(json_agg(json_build_object('topic', p.topic, 'pending', p.n, 'in_flight', h.in_flight, 'old', h.old, 'head', h.n, 'rewalk', f.ran)
	                                ORDER BY p.n DESC, p.topic), '[]'),
	    'pending', coalesce(sum(p.n), 0),
	    'in_flight', coalesce(sum(h.in_flight), 0),
	    'oldest_secs', coalesce(extract(epoch FROM now() - min(h.oldest)), 0),
	    'dead', (SELECT coalesce(sum(n), 0) FROM outbox_backlog_count WHERE status = 'dead'),
	    'paused', (SELECT coalesce(json_agg(json_build_object('topic', topic, 'paused_by', paused_by,
	                                         'paused_at', paused_at, 'reason', reason) ORDER BY topic), '[]')
	                 FROM outbox_topic_pause))
	  FROM (SELECT topic, sum(n) AS n FROM outbox_backlog_count WHERE status = 'pending'
	         GROUP BY topic HAVING sum(n) > 0) p
	 CROSS JOIN LATERAL (
	        SELECT coalesce((` + state + `::jsonb -> p.topic ->> 'from')::uuid, '00000000-0000-0000-0000-000000000000') AS start,
	               ARRAY(SELECT jsonb_array_elements_text(` + state + `::jsonb -> p.topic -> 'stuck'))::uuid[] AS stuck) c
	 CROSS JOIN LATERAL (
	        SELECT count(*) AS n, count(*) FILTER (WHERE s.locked_until > now()) AS in_flight, min(s.created_at) AS oldest,
	               coalesce(array_agg(s.id ORDER BY s.id) FILTER (WHERE s.id < ` + young + `::uuid), '{}') AS old
	          FROM outbox_event s
	         WHERE s.id = ANY (c.stuck) AND s.status = 'pending') k
	 CROSS JOIN LATERAL (
	        SELECT count(*) AS n, count(*) FILTER (WHERE head.locked_until > now()) AS in_flight, min(head.created_at) AS oldest,
	               coalesce((array_agg(head.id ORDER BY head.id) FILTER (WHERE head.id < ` + young + `::uuid))[1:` + stuck + `], '{}') AS old
	          FROM (SELECT e.id, e.locked_until, e.created_at FROM outbox_event e
	                 WHERE e.status = 'pending' AND e.topic > '' AND e.topic = ANY (ARRAY[p.topic]) AND e.id >= c.start
	                 ORDER BY e.topic, e.id LIMIT ` + head + ` - k.n) head) w
	 CROSS JOIN LATERAL (
	        SELECT count(*) > 0 AS ran, count(*) AS n, count(*) FILTER (WHERE head.locked_until > now()) AS in_flight, min(head.created_at) AS oldest,
	               coalesce((array_agg(head.id ORDER BY head.id) FILTER (WHERE head.id < ` + young + `::uuid))[1:` + stuck + `], '{}') AS old
	          FROM (SELECT e.id, e.locked_until, e.created_at FROM outbox_event e
	                 WHERE k.n + w.n < least(p.n, ` + head + `) AND c.start > '00000000-0000-0000-0000-000000000000'
	                   AND e.status = 'pending' AND e.topic > '' AND e.topic = ANY (ARRAY[p.topic])
	                 ORDER BY e.topic, e.id LIMIT ` + head + `) head) f
	 CROSS JOIN LATERAL (
	        SELECT CASE WHEN f.ran THEN f.n ELSE k.n + w.n END AS n,
	               CASE WHEN f.ran THEN f.in_flight ELSE k.in_flight + w.in_flight END AS in_flight,
	               CASE WHEN f.ran THEN f.oldest ELSE least(k.oldest, w.oldest) END AS oldest,
	               CASE WHEN f.ran THEN f.old ELSE (k.old || w.old)[1:` + stuck + `] END AS old) h`
}

// Scan implements db.Read.
func (r *BacklogRead) Scan(src []byte) error {
	var w struct {
		Backlog
		Topics []struct {
			TopicBacklog
			Old    []uuid.UUID `json:"old"`
			Head   int         `json:"head"`
			Rewalk bool        `json:"rewalk"`
		} `json:"topics"`
		OldestSecs float64 `json:"oldest_secs"`
	}
	if err := db.ScanJSON(src, &w); err != nil {
		return fmt.Errorf("outbox: backlog: %w", err)
	}
	r.Backlog = w.Backlog
	r.Backlog.Topics = make([]TopicBacklog, len(w.Topics))
	read := make(map[string]topicRead, len(w.Topics))
	for i, t := range w.Topics {
		r.Backlog.Topics[i] = t.TopicBacklog
		read[t.Topic] = topicRead{old: t.Old, head: t.Head, rewalk: t.Rewalk}
	}
	r.Backlog.OldestPendingAge = time.Duration(max(w.OldestSecs, 0) * float64(time.Second))
	if r.Cursor != nil {
		r.Cursor.moved(r.read, read)
	}
	return nil
}

// ReadBacklog reads the backlog on its own.
func ReadBacklog(ctx context.Context, q db.RowQuerier) (Backlog, error) {
	var r BacklogRead
	if _, err := db.ReadAll(ctx, q, &r); err != nil {
		return Backlog{}, fmt.Errorf("outbox: backlog: %w", err)
	}
	return r.Backlog, nil
}

// PublishedSinceRead counts events published after Since (the previous
// snapshot's time) and up to the statement's now() (this snapshot's time),
// through the published partial index: O(published since).
//
// The upper bound makes consecutive snapshots' windows meet without
// overlap: a mark stamps published_at with its own statement's time, which
// can be after this statement's now() and still committed before its
// snapshot; that event now counts in the next window only, not in both. It
// also gives the snapshot's generic plan (db.ReadAllGeneric) a range to
// estimate, a small share of the index, where a lone published_at > $n is
// estimated at a third of it: at 10M events that plan was a parallel scan
// compiled by JIT, 200 ms for a count of a few rows.
type PublishedSinceRead struct {
	Since time.Time
	Count int64
}

// Expr implements db.Read.
func (r *PublishedSinceRead) Expr(args *db.Args) string {
	return `SELECT count(*) FROM outbox_event WHERE status = 'published' AND published_at > ` + args.Add(r.Since) + ` AND published_at <= now()`
}

// Scan implements db.Read.
func (r *PublishedSinceRead) Scan(src []byte) error {
	return db.ScanJSON(src, &r.Count)
}

// DeadEvent is a recent dead letter (no payload: summaries carry no data).
type DeadEvent struct {
	ID        string    `json:"id"`
	Topic     string    `json:"topic"`
	EventType string    `json:"event_type"`
	Attempts  int       `json:"attempts"`
	DeadAt    time.Time `json:"dead_at"`
	// LastError is the start of the last publish error (its first 160
	// characters), so support sees why an event died without opening it.
	// It is attacker-reachable text: views escape it like everything else.
	LastError string `json:"last_error"`
}

// RecentDeadRead lists the Limit newest dead letters (dead partial index).
type RecentDeadRead struct {
	Limit  int
	Events []DeadEvent
}

// Expr implements db.Read.
func (r *RecentDeadRead) Expr(args *db.Args) string {
	return `SELECT coalesce(json_agg(json_build_object('id', id, 'topic', topic, 'event_type', event_type,
	                                 'attempts', attempts, 'dead_at', dead_at,
	                                 'last_error', left(coalesce(last_error, dead_reason, ''), 160))
	                                 ORDER BY dead_at DESC, id), '[]')
	  FROM (SELECT id, topic, event_type, attempts, dead_at, last_error, dead_reason FROM outbox_event
	         WHERE status = 'dead' ORDER BY dead_at DESC, id LIMIT ` + db.Int(r.Limit) + `) d`
}

// Scan implements db.Read.
func (r *RecentDeadRead) Scan(src []byte) error {
	r.Events = nil
	if err := db.ScanJSON(src, &r.Events); err != nil {
		return fmt.Errorf("outbox: recent dead letters: %w", err)
	}
	return nil
}
