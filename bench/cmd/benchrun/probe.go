package main

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/internal/broker"
)

// probeSink is the in-process sink of R2–R4: it records when each event
// first arrived, counts duplicates and per-aggregate order inversions (an
// event arriving after a later event of its aggregate), and refuses the
// events refuse picks (R4's poison).
type probeSink struct {
	refuse  func(broker.Message) bool
	refused atomic.Int64
	total   atomic.Int64 // accepted, duplicates included

	mu         sync.Mutex
	first      map[string]time.Time
	maxSeq     map[string]int64
	dups       int64
	inversions int64
}

var errPoison = errors.New("bench: the sink refuses this event")

func newProbeSink(refuse func(broker.Message) bool) *probeSink {
	return &probeSink{refuse: refuse, first: map[string]time.Time{}, maxSeq: map[string]int64{}}
}

func (s *probeSink) Publish(_ context.Context, m broker.Message) error {
	now := time.Now()
	if s.refuse != nil && s.refuse(m) {
		s.refused.Add(1)
		return errPoison
	}
	s.record(m, now)
	return nil
}

// record counts m as arrived at now (R4's outage phase calls it for what
// JetStream acknowledged).
func (s *probeSink) record(m broker.Message, now time.Time) {
	s.total.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, seen := s.first[m.ID]; seen {
		s.dups++
		return
	}
	s.first[m.ID] = now
	agg := m.AggregateType + "/" + m.AggregateID
	if m.AggregateSeq < s.maxSeq[agg] {
		s.inversions++
	} else {
		s.maxSeq[agg] = m.AggregateSeq
	}
}

// reset forgets every arrival (R2's warm-up: what it sent is not measured).
func (s *probeSink) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total.Store(0)
	s.first, s.maxSeq, s.dups, s.inversions = map[string]time.Time{}, map[string]int64{}, 0, 0
}

func (s *probeSink) distinct() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.first)
}

func (s *probeSink) arrived(id string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.first[id]
	return t, ok
}

func (s *probeSink) counts() (distinct int, dups, inversions int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.first), s.dups, s.inversions
}

// firstAfter is the earliest first arrival after t, and the latest first
// arrival overall (zero when none).
func (s *probeSink) firstAfter(t time.Time) (first, last time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.first {
		if a.After(t) && (first.IsZero() || a.Before(first)) {
			first = a
		}
		if a.After(last) {
			last = a
		}
	}
	return first, last
}
