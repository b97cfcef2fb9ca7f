// Package testkit holds the few helpers every room's tests share: one way
// to wait for a condition and one fake clock. It is imported by tests only.
package testkit

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// Deadline is how long Eventually waits: generous, because a loaded 2-core
// machine running every package's tests at once is slow; a test never
// asserts on timing, it only refuses to hang.
const Deadline = 90 * time.Second

// Eventually polls cond until it reports true and fails the test if that
// has not happened by Deadline, naming what it waited for and cond's last
// error.
func Eventually(t testing.TB, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(Deadline)
	var last error
	for {
		ok, err := cond()
		if ok {
			return
		}
		last = err
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %s waiting for %s (last error: %v)", Deadline, what, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// UntilCount polls count until it reaches want. Long drains (thousands of
// messages, each its own transaction) run at whatever pace a loaded machine
// allows, so it fails only when the count has not moved for Deadline, not
// when the whole drain takes longer than that; the failure gives the count.
func UntilCount(t testing.TB, what string, want int64, count func() int64) {
	t.Helper()
	last := count()
	deadline := time.Now().Add(Deadline)
	for last < want {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s: stuck at %d of %d for %s", what, last, want, Deadline)
		}
		time.Sleep(10 * time.Millisecond)
		if n := count(); n != last {
			last, deadline = n, time.Now().Add(Deadline)
		}
	}
}

// Until is Eventually for a condition that cannot fail.
func Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	Eventually(t, what, func() (bool, error) { return cond(), nil })
}

// Clock is an injected time source that tests move instead of sleeping.
// Safe for concurrent use.
type Clock struct {
	mu   sync.Mutex
	now  time.Time
	tick time.Duration
}

// NewClock starts at start, truncated to microseconds: what PostgreSQL's
// timestamptz keeps, so a time written and read back compares equal.
func NewClock(start time.Time) *Clock {
	return &Clock{now: start.Truncate(time.Microsecond)}
}

// Ticking makes every Now advance the clock by d first, so no two reads are
// equal, as on a real clock (a value computed twice must not match by
// accident). It returns c.
func (c *Clock) Ticking(d time.Duration) *Clock {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tick = d
	return c
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(c.tick)
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Buffer is a bytes.Buffer safe for concurrent writers: the log or the
// output of a process that runs on while the test reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
