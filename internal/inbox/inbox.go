// Package inbox makes consumers idempotent: the dedupe row and the effect
// commit in one transaction, so a redelivered message changes nothing.
package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db"
)

// Result says what Handle did with a message.
type Result int

const (
	Applied   Result = iota // the effect ran and committed
	Duplicate               // seen before: the effect did not run
)

func (r Result) String() string {
	switch r {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	}
	return fmt.Sprintf("Result(%d)", int(r))
}

// Inbox deduplicates messages per consumer.
type Inbox struct {
	pool *pgxpool.Pool
}

// New returns an Inbox over pool.
func New(pool *pgxpool.Pool) *Inbox { return &Inbox{pool: pool} }

// Handle runs effect for (consumer, msgID) at most once: the inbox row and
// whatever effect writes in tx commit together. A duplicate returns
// Duplicate without running effect. If effect fails, nothing is recorded and
// the message may be delivered again.
func (in *Inbox) Handle(ctx context.Context, consumer, msgID string, effect func(tx pgx.Tx) error) (Result, error) {
	if consumer == "" || msgID == "" {
		return 0, errors.New("inbox: consumer and message id are required")
	}
	res := Applied
	err := db.WithTx(ctx, in.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO inbox_message (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, consumer, msgID)
		if err != nil {
			return fmt.Errorf("inbox: record %s: %w", msgID, err)
		}
		if tag.RowsAffected() == 0 {
			res = Duplicate
			_, err := tx.Exec(ctx, `
				INSERT INTO inbox_consumer (consumer, duplicates) VALUES ($1, 1)
				ON CONFLICT (consumer) DO UPDATE SET duplicates = inbox_consumer.duplicates + 1, updated_at = now()`, consumer)
			return err
		}
		if err := effect(tx); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `
			INSERT INTO inbox_consumer (consumer, processed) VALUES ($1, 1)
			ON CONFLICT (consumer) DO UPDATE SET processed = inbox_consumer.processed + 1, updated_at = now()`, consumer)
		return err
	})
	if err != nil {
		return 0, err
	}
	return res, nil
}
