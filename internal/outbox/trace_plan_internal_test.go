package outbox

import (
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// The trace page reads one aggregate's events along the unique index on
// (aggregate_type, aggregate_id, aggregate_seq), whatever the history.
func TestOfAggregatePlanUsesTheAggregateIndex(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	seedPlanRows(t, pool, 100_000)
	plan := explain(t, pool, strings.ReplaceAll(strings.ReplaceAll(strings.ReplaceAll(ofAggregateSQL, "$1", "@t"), "$2", "@id"), "$3", "@n"),
		pgx.NamedArgs{"t": "plan", "id": "a42", "n": MaxAggregateEvents})
	t.Logf("plan:\n%s", plan)
	if !slices.Contains(indexesOf(plan), "outbox_event_aggregate_type_aggregate_id_aggregate_seq_key") || strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Sort") {
		t.Fatalf("the aggregate's events are not read along its index:\n%s", plan)
	}
}
