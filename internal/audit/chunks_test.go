package audit_test

import (
	"context"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// The chunk rows naming an event, on a trail of 300,000 rows of which 2,000
// are chunks of 100 ids each: exactly the chunks that name it, newest
// first, each event's in turn; a row of another action naming the id in
// the same place is not a chunk; and the plan probes the partial index
// (migration 00033) instead of reading the trail.
func TestChunksNamingReadsTheIndex(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	// Every 150th row is a chunk: chunk c (row 150c) names e<50c> to
	// e<50c+99>, so each id from e100 on is in two chunks. Row 1 names e1000
	// the same way under another action.
	if _, err := pool.Exec(ctx, `
		INSERT INTO audit_event (actor_name, action, target_type, target_id, after, outcome, prev_hash, hash)
		SELECT 'console job runner', CASE WHEN g % 150 = 0 THEN 'outbox.bulk.chunk' ELSE 'action.' || (g % 50) END,
		       'job', 'job-' || (g / 150),
		       CASE WHEN g % 150 = 0 THEN jsonb_build_object('kind', 'retry', 'count', 100,
		                'ids', (SELECT jsonb_agg('e' || ((g / 150) * 50 + k)) FROM generate_series(0, 99) k))
		            WHEN g % 150 = 1 THEN jsonb_build_object('ids', jsonb_build_array('e1000')) END,
		       'ok', '\x00', '\x00'
		  FROM generate_series(1, 300000) g;
		ANALYZE audit_event;`); err != nil {
		t.Fatal(err)
	}
	got, err := audit.ChunksNaming(ctx, pool, []string{"e1000", "e60", "nobody"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, c := range got {
		seen = append(seen, c.Event+"/"+c.Job+"/"+c.Kind)
		if c.Action != audit.BulkChunkAction || c.ActorName != "console job runner" {
			t.Errorf("row %+v", c)
		}
	}
	// e1000 is in chunks 20 (1000..1099) and 19 (950..1049); e60 only in
	// chunk 1 (50..149), the first.
	if want := "e1000/job-20/retry e1000/job-19/retry e60/job-1/retry"; strings.Join(seen, " ") != want {
		t.Errorf("chunks %q, want %q", strings.Join(seen, " "), want)
	}
	if got, err := audit.ChunksNaming(ctx, pool, []string{"e1000"}, 1); err != nil || len(got) != 1 || got[0].Job != "job-20" {
		t.Errorf("limit 1: %+v, %v", got, err)
	}

	plan := explain(t, pool, audit.ChunksNamingSQL, []string{"e1000"}, 50)
	if !strings.Contains(plan, "audit_event_bulk_ids_idx") || strings.Contains(plan, "Seq Scan on audit_event") {
		t.Errorf("the chunks' read does not probe audit_event_bulk_ids_idx:\n%s", plan)
	}
}
