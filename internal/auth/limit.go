package auth

import (
	"sync"
	"time"
)

// The console limits what one client address may make it write: sign-ins
// (pending logins) and refusal-log rows.

// maxTrackedIPs bounds the limiter's memory: past it, windows that have
// ended are swept, and if the table is still full new addresses are
// refused until windows end (a flood from many addresses fails closed).
const maxTrackedIPs = 100_000

// IPLimiter allows each client IP at most per requests in each window.
type IPLimiter struct {
	per    int
	window time.Duration
	now    func() time.Time

	mu   sync.Mutex
	seen map[string]*ipWindow
}

type ipWindow struct {
	start time.Time
	n     int
}

// NewIPLimiter allows per requests from each IP in each window, on the clock now.
func NewIPLimiter(per int, window time.Duration, now func() time.Time) *IPLimiter {
	return &IPLimiter{per: per, window: window, now: now, seen: map[string]*ipWindow{}}
}

// Allow counts one request from ip and reports whether it is within limit.
func (l *IPLimiter) Allow(ip string) bool {
	return l.take(ip, false) <= l.per
}

// Take counts one request from key and returns how many it has made in the
// current window, this one included, counting on past the limit (a full
// table answers per+1: over the limit).
func (l *IPLimiter) Take(key string) int {
	return l.take(key, true)
}

// take counts a request of key; past per, it counts on only when beyond
// is set (Allow stops counting at the limit).
func (l *IPLimiter) take(key string, beyond bool) int {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.seen[key]
	if w == nil || now.Sub(w.start) >= l.window {
		if w == nil && len(l.seen) >= maxTrackedIPs {
			for k, v := range l.seen {
				if now.Sub(v.start) >= l.window {
					delete(l.seen, k)
				}
			}
			if len(l.seen) >= maxTrackedIPs {
				return l.per + 1
			}
		}
		w = &ipWindow{start: now}
		l.seen[key] = w
	}
	if w.n >= l.per && !beyond {
		return l.per + 1
	}
	w.n++
	return w.n
}
