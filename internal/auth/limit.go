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
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.seen[ip]
	if w == nil || now.Sub(w.start) >= l.window {
		if w == nil && len(l.seen) >= maxTrackedIPs {
			for k, v := range l.seen {
				if now.Sub(v.start) >= l.window {
					delete(l.seen, k)
				}
			}
			if len(l.seen) >= maxTrackedIPs {
				return false
			}
		}
		w = &ipWindow{start: now}
		l.seen[ip] = w
	}
	if w.n >= l.per {
		return false
	}
	w.n++
	return true
}
