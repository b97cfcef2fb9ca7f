package web

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/views"
)

// The outbox list's live notice. The list reads the outbox's part of the
// snapshot when it renders (live.ReadOutbox: the same reads the feed
// composes) and opens /ws with that mark in the URL. (An event's page hears
// about its own event instead: record_live.go.) The feed still
// reads one snapshot per tick for the whole process; the socket compares
// each new snapshot with the page's mark (no query) and, when the outbox
// moved, pushes a small notice: how many times it changed since the page
// loaded and which figures moved. The page itself is not re-rendered: the
// operator reloads when ready, so a form half filled in is never lost.

// outboxMark is what a page watches: dead letters, events held behind them,
// the newest dead letters, and (for pages about pending work) the backlog.
type outboxMark struct {
	dead, held, pending int64
	heldPartial         bool   // held is a lower bound (outbox.Held.Partial)
	recent              string // hash of the newest dead letters' ids
	withPending         bool
}

func markOf(s live.Snapshot, withPending bool) outboxMark {
	h := sha256.New()
	for _, e := range s.RecentDead {
		h.Write([]byte(e.ID))
	}
	m := outboxMark{dead: s.Dead, held: s.Held.Events, heldPartial: s.Held.Partial, recent: hex.EncodeToString(h.Sum(nil)[:4]), withPending: withPending}
	if withPending {
		m.pending = s.Pending
	}
	return m
}

// String is the mark as the page's /ws URL carries it: d.h[+].recent[.p],
// with "+" when h is a lower bound.
func (m outboxMark) String() string {
	s := fmt.Sprintf("%d.%s.%s", m.dead, m.heldString(), m.recent)
	if m.withPending {
		s += "." + strconv.FormatInt(m.pending, 10)
	}
	return s
}

func (m outboxMark) heldString() string {
	s := strconv.FormatInt(m.held, 10)
	if m.heldPartial {
		s += "+"
	}
	return s
}

// heldCount is the held count as the page shows it.
func (m outboxMark) heldCount() string {
	s := views.Count(m.held)
	if m.heldPartial {
		s += "+"
	}
	return s
}

// parseMark reads a mark from a URL; anything else is no mark.
func parseMark(s string) (outboxMark, bool) {
	parts := strings.Split(s, ".")
	if len(s) > 80 || (len(parts) != 3 && len(parts) != 4) {
		return outboxMark{}, false
	}
	var (
		m   outboxMark
		err error
	)
	if m.dead, err = strconv.ParseInt(parts[0], 10, 64); err != nil || m.dead < 0 {
		return outboxMark{}, false
	}
	held, partial := strings.CutSuffix(parts[1], "+")
	m.heldPartial = partial
	if m.held, err = strconv.ParseInt(held, 10, 64); err != nil || m.held < 0 {
		return outboxMark{}, false
	}
	if b, err := hex.DecodeString(parts[2]); err != nil || len(b) != 4 {
		return outboxMark{}, false
	}
	m.recent = parts[2]
	if len(parts) == 4 {
		m.withPending = true
		if m.pending, err = strconv.ParseInt(parts[3], 10, 64); err != nil || m.pending < 0 {
			return outboxMark{}, false
		}
	}
	return m, true
}

// watchURL is the /ws URL of an outbox page rendered at snapshot s: the
// outbox's page kind, so the socket gets no dashboard fragment (the page has
// no target for them), only a message per tick to compare the mark on.
func watchURL(s live.Snapshot, withPending bool) string {
	return "/ws?" + url.Values{"page": {live.PageOutbox}, "watch": {"outbox"}, "since": {markOf(s, withPending).String()},
		"at": {strconv.FormatInt(s.At.UnixMicro(), 10)}}.Encode()
}

// outboxWatch is one socket's view of its page's mark.
type outboxWatch struct {
	since, last outboxMark
	at          time.Time // when the page read its mark (database clock)
	changes     int
}

// newOutboxWatch reads the socket's query; nil when it watches nothing.
func newOutboxWatch(q url.Values) *outboxWatch {
	if q.Get("watch") != "outbox" {
		return nil
	}
	m, ok := parseMark(q.Get("since"))
	at, err := strconv.ParseInt(q.Get("at"), 10, 64)
	if !ok || err != nil {
		return nil
	}
	return &outboxWatch{since: m, last: m, at: time.UnixMicro(at)}
}

// check compares the newest snapshot with the page's mark and returns the
// notice to push, or nil when nothing moved since the last check.
func (w *outboxWatch) check(s live.Snapshot) ([]byte, error) {
	if s.At.Before(w.at) {
		// Read before the page: comparing it would report the page's own
		// state (or an older one) as a change.
		return nil, nil
	}
	cur := markOf(s, w.since.withPending)
	if cur == w.last {
		return nil, nil
	}
	w.last = cur
	w.changes++
	n := views.OutboxNotice{Changes: w.changes, OOB: true}
	moved := func(what string, from, to int64) {
		if from != to {
			n.Lines = append(n.Lines, fmt.Sprintf("%s %s → %s", what, views.Count(from), views.Count(to)))
		}
	}
	moved("dead letters", w.since.dead, cur.dead)
	if w.since.held != cur.held || w.since.heldPartial != cur.heldPartial {
		n.Lines = append(n.Lines, fmt.Sprintf("held behind dead letters %s → %s", w.since.heldCount(), cur.heldCount()))
	}
	if w.since.withPending {
		moved("pending", w.since.pending, cur.pending)
	}
	if cur.recent != w.since.recent && cur.dead == w.since.dead {
		n.Lines = append(n.Lines, "the latest dead letters changed")
	}
	var buf bytes.Buffer
	if err := views.OutboxChanged(n).Render(context.Background(), &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// outboxNotice is the notice to push after a feed message, if the socket
// watches the outbox and it moved.
func (a *App) outboxNotice(w *outboxWatch) []byte {
	if w == nil {
		return nil
	}
	s, ok := a.feed.Latest()
	if !ok {
		return nil
	}
	b, err := w.check(s)
	if err != nil {
		a.log.Error("render the outbox notice", "err", err)
		return nil
	}
	return b
}
