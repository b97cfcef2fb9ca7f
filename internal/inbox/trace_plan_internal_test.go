package inbox

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// The trace page's receipts read probes the inbox per known consumer and
// never scans its history: 300k inbox rows and effects of three consumers,
// and the plan for a page's worth of ids walks the primary key and the
// effect index only.
func TestReceiptsPlanProbesIndexes(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	for _, sql := range []string{
		`INSERT INTO inbox_message (consumer, message_id, processed_at)
		 SELECT 'c' || (g % 3), 'm' || g, now() FROM generate_series(1, 300000) g`,
		`INSERT INTO consume_effect (consumer, event_id, topic, event_type, aggregate_type, aggregate_id, aggregate_seq)
		 SELECT 'c' || (g % 3), 'm' || g, 't', 'e.v1', 'a', 'a' || (g % 1000), 1 FROM generate_series(1, 300000) g`,
		`INSERT INTO inbox_consumer_shard (consumer, shard, processed) SELECT 'c' || c, s, 1000 FROM generate_series(0, 2) c, generate_series(0, 7) s`,
		`ANALYZE inbox_message, consume_effect, inbox_consumer_shard, inbox_consumer`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	ids := []string{"m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9", "m10"}
	rows, err := pool.Query(ctx, "EXPLAIN "+receiptsSQL, ids)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	plan := strings.Join(lines, "\n")
	t.Logf("plan:\n%s", plan)
	for _, table := range []string{"inbox_message", "consume_effect"} {
		if strings.Contains(plan, "Seq Scan on "+table) {
			t.Errorf("the receipts read scans %s", table)
		}
	}
	for _, index := range []string{"inbox_message_pkey", "consume_effect_event_idx"} {
		if !strings.Contains(plan, index) {
			t.Errorf("the receipts read does not use %s", index)
		}
	}
	got, err := ReceiptsOf(ctx, pool, ids)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(ids) {
		t.Fatalf("%d receipts for %d messages each applied by one consumer", len(got), len(ids))
	}
	for _, r := range got {
		if r.EffectAt == nil || r.Effects != 1 || r.Consumer == "" {
			t.Errorf("receipt %+v, want one effect", r)
		}
	}
}
