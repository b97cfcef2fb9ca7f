package outbox

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
)

// MaxAggregateEvents bounds OfAggregate.
const MaxAggregateEvents = 200

const ofAggregateSQL = `SELECT ` + rowColumns + ` FROM outbox_event
	WHERE aggregate_type = $1 AND aggregate_id = $2 ORDER BY aggregate_seq LIMIT $3`

// OfAggregate lists the first limit (at most MaxAggregateEvents) events of
// one aggregate in sequence order, along the unique index on
// (aggregate_type, aggregate_id, aggregate_seq).
func OfAggregate(ctx context.Context, q db.Querier, aggregateType, aggregateID string, limit int) ([]Row, error) {
	if limit <= 0 || limit > MaxAggregateEvents {
		limit = MaxAggregateEvents
	}
	rows, err := q.Query(ctx, ofAggregateSQL, aggregateType, aggregateID, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: events of %s %s: %w", aggregateType, aggregateID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		var row Row
		err := r.Scan(row.scanTargets()...)
		return row, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: events of %s %s: %w", aggregateType, aggregateID, err)
	}
	return out, nil
}

// HeaderMap is the event's headers as written by Insert (a string map);
// nil when they cannot be read as one.
func (r Row) HeaderMap() map[string]string {
	var m map[string]string
	if len(r.Headers) == 0 || json.Unmarshal(r.Headers, &m) != nil {
		return nil
	}
	return m
}
