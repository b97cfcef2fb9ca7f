package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
)

// Receipt is what one consumer did with one message: when its inbox row was
// written (the effect's transaction) and, for the reference consumer, when
// its effect row was applied and how many there are (more than one would
// break "effect once").
type Receipt struct {
	MessageID   string
	Consumer    string
	ProcessedAt time.Time
	EffectAt    *time.Time // first consume_effect row, nil when the consumer keeps none
	Effects     int
}

// MaxReceiptMessages bounds one ReceiptsOf call.
const MaxReceiptMessages = 500

const receiptsSQL = `
		WITH c AS (SELECT consumer FROM inbox_consumer_shard UNION SELECT consumer FROM inbox_consumer)
		SELECT m.message_id, m.consumer, m.processed_at, e.first_at, coalesce(e.n, 0)
		  FROM unnest($1::text[]) AS ids(id)
		  CROSS JOIN c
		  JOIN inbox_message m ON m.consumer = c.consumer AND m.message_id = ids.id
		  LEFT JOIN LATERAL (SELECT min(x.applied_at) AS first_at, count(*) AS n
		                       FROM consume_effect x
		                      WHERE x.consumer = m.consumer AND x.event_id = m.message_id) e ON true
		 ORDER BY m.message_id, m.processed_at, m.consumer`

// ReceiptsOf lists every consumer's inbox row (and reference effect) for
// each of ids, by message then time. It never scans the inbox history: the
// known consumers (a few counter rows) are crossed with the ids and each
// pair is one primary-key probe of inbox_message and one probe of
// consume_effect_event_idx.
func ReceiptsOf(ctx context.Context, q db.Querier, ids []string) ([]Receipt, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	if len(ids) > MaxReceiptMessages {
		ids = ids[:MaxReceiptMessages]
	}
	rows, err := q.Query(ctx, receiptsSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("inbox: receipts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Receipt, error) {
		var rc Receipt
		err := r.Scan(&rc.MessageID, &rc.Consumer, &rc.ProcessedAt, &rc.EffectAt, &rc.Effects)
		return rc, err
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: receipts: %w", err)
	}
	return out, nil
}
