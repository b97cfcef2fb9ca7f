package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/internal/db"
)

// ConsumerStats are one consumer's totals since it first handled a message.
type ConsumerStats struct {
	Consumer   string `json:"consumer"`
	Processed  int64  `json:"processed"`  // effects applied
	Duplicates int64  `json:"duplicates"` // redeliveries absorbed
	Stale      int64  `json:"stale"`      // out-of-order messages dropped
	// LastApplied is when it last applied an effect (its transaction's
	// start; zero before its first since migration 00027).
	LastApplied time.Time `json:"last_applied"`
}

// ConsumersRead lists every consumer's counts, by name: a db.Read part, read
// alone (Stats) or in the console's snapshot. It sums a handful of counter
// rows per consumer, never the inbox_message history.
type ConsumersRead struct{ Consumers []ConsumerStats }

// Expr implements db.Read.
func (r *ConsumersRead) Expr(*db.Args) string {
	return `SELECT coalesce(json_agg(json_build_object('consumer', consumer, 'processed', processed,
	                                 'duplicates', duplicates, 'stale', stale, 'last_applied', last_applied) ORDER BY consumer), '[]')
	  FROM (SELECT consumer, sum(processed) AS processed, sum(duplicates) AS duplicates, sum(stale) AS stale,
	               max(applied_at) AS last_applied
	          FROM (SELECT consumer, processed, 0 AS duplicates, 0 AS stale, applied_at FROM inbox_consumer_shard
	                UNION ALL
	                SELECT consumer, processed, duplicates, stale, NULL FROM inbox_consumer) c
	         GROUP BY consumer) s`
}

// Scan implements db.Read.
func (r *ConsumersRead) Scan(src []byte) error {
	r.Consumers = nil
	if err := db.ScanJSON(src, &r.Consumers); err != nil {
		return fmt.Errorf("inbox: consumer counts: %w", err)
	}
	return nil
}

// Stats lists every consumer's counts, by name.
func Stats(ctx context.Context, q db.RowQuerier) ([]ConsumerStats, error) {
	var r ConsumersRead
	if _, err := db.ReadAll(ctx, q, &r); err != nil {
		return nil, fmt.Errorf("inbox: stats: %w", err)
	}
	return r.Consumers, nil
}

// DuplicateRatio is the share of deliveries that were redeliveries the
// inbox absorbed: duplicates ÷ (processed + duplicates) (seed 002). ok is
// false before the first delivery (no ratio, rather than 0%).
func (s ConsumerStats) DuplicateRatio() (ratio float64, ok bool) {
	n := s.Processed + s.Duplicates
	if n <= 0 {
		return 0, false
	}
	return float64(s.Duplicates) / float64(n), true
}

// Total sums the consumers' counts (Consumer is empty): the overall
// duplicate ratio is Total(stats).DuplicateRatio().
func Total(stats []ConsumerStats) ConsumerStats {
	var t ConsumerStats
	for _, s := range stats {
		t.Processed += s.Processed
		t.Duplicates += s.Duplicates
		t.Stale += s.Stale
		if s.LastApplied.After(t.LastApplied) {
			t.LastApplied = s.LastApplied
		}
	}
	return t
}
