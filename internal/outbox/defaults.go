package outbox

import "time"

// Defaults of RelayConfig, Backoff and pruning: the relay applies them to
// zero fields, and `console relay` / `console prune` show them as their flag
// defaults, so each number lives here only.
const (
	// DefaultBatchSize is 500: since the claim became a HOT update (migration
	// 00020), a claim's own cost (planning it afresh, its synchronous commit,
	// a round trip) is a visible share of a batch of 100; at 500 the relay
	// commits a fifth as often for the same events (bench/README.md, change
	// 5). A claim takes only what is eligible, so small backlogs are not held
	// longer: the batch is a ceiling, not a wait.
	DefaultBatchSize          = 500
	DefaultLease              = 30 * time.Second
	DefaultPollInterval       = time.Second
	DefaultMaxAttempts        = 10
	DefaultPublishConcurrency = 8
	DefaultBackoffBase        = time.Second
	DefaultBackoffCap         = 5 * time.Minute
	// DefaultOutagePauseCap bounds the relay's pause while the broker is
	// unreachable (RelayConfig.OutagePauseCap): one probe per relay every
	// 5 s at most during a long outage, and the broker's return noticed
	// within 5 s.
	DefaultOutagePauseCap = 5 * time.Second
	// DefaultRetention is how long published events are kept before
	// Prune deletes them.
	DefaultRetention = 7 * 24 * time.Hour
)
