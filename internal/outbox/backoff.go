package outbox

import (
	"math/rand/v2"
	"time"
)

// Backoff spaces out the attempts of an event whose publish failed:
// exponential in the number of attempts, capped, and jittered so events that
// failed together (a broker outage) do not all come back in the same instant.
type Backoff struct {
	Base time.Duration  // delay after the first failed attempt (before jitter); default 1s
	Cap  time.Duration  // largest delay; default 5m
	Rand func() float64 // [0,1) source for the jitter; nil = math/rand/v2 (tests inject one)
}

func (b Backoff) withDefaults() Backoff {
	if b.Base <= 0 {
		b.Base = DefaultBackoffBase
	}
	if b.Cap <= 0 {
		b.Cap = DefaultBackoffCap
	}
	if b.Cap < b.Base {
		b.Cap = b.Base
	}
	if b.Rand == nil {
		b.Rand = rand.Float64
	}
	return b
}

// Delay is the wait after the attempts-th failed attempt (1-based): "equal
// jitter", half of min(Cap, Base·2^(attempts-1)) fixed and half random, so a
// delay never collapses to zero yet retries spread out.
func (b Backoff) Delay(attempts int) time.Duration {
	b = b.withDefaults()
	if attempts < 1 {
		attempts = 1
	}
	d := b.Base
	for i := 1; i < attempts && d < b.Cap; i++ {
		d *= 2
	}
	if d > b.Cap {
		d = b.Cap
	}
	half := d / 2
	return half + time.Duration(b.Rand()*float64(d-half))
}
