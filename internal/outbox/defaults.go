package outbox

import "time"

// Defaults of RelayConfig, Backoff and pruning: the relay applies them to
// zero fields, and `console relay` / `console prune` show them as their flag
// defaults, so each number lives here only.
const (
	DefaultBatchSize          = 100
	DefaultLease              = 30 * time.Second
	DefaultPollInterval       = time.Second
	DefaultMaxAttempts        = 10
	DefaultPublishConcurrency = 8
	DefaultBackoffBase        = time.Second
	DefaultBackoffCap         = 5 * time.Minute
	// DefaultRetention is how long published events are kept before
	// Prune deletes them.
	DefaultRetention = 7 * 24 * time.Hour
)
