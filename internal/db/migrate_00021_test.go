package db_test

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// Migration 00021 seeds the backlog counts from the events already there,
// exactly, while producers keep inserting and deleting: the CREATE
// TRIGGER's lock holds them off until the migration commits, and once it
// has, the triggers count them.
func TestMigration00021SeedsExactBacklogCountsUnderWriters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbtest.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := db.OpenConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, os.DirFS("migrations"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 20); err != nil {
		t.Fatalf("migrate to 20: %v", err)
	}
	const insert = `INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, dead_at, published_at)
		SELECT gen_random_uuid(), 'seed', gen_random_uuid()::text, 1, 't' || (g % 3), 'seed.v1', '{}',
		       s, CASE WHEN s = 'dead' THEN now() END, CASE WHEN s = 'published' THEN now() END
		  FROM generate_series(1, $1) g, LATERAL (SELECT (ARRAY['pending', 'pending', 'dead', 'published'])[1 + g % 4] AS s) x`
	if _, err := pool.Exec(ctx, insert, 1000); err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var writes atomic.Int64
	for range 3 {
		wg.Go(func() {
			for i := 0; wctx.Err() == nil; i++ {
				sql, args := insert, []any{1 + i%7}
				if i%3 == 2 {
					sql, args = `DELETE FROM outbox_event WHERE id IN (SELECT id FROM outbox_event LIMIT 3 FOR UPDATE SKIP LOCKED)`, nil
				}
				if _, err := pool.Exec(wctx, sql, args...); err != nil {
					if wctx.Err() == nil {
						t.Errorf("writer: %v", err)
					}
					return
				}
				writes.Add(1)
			}
		})
	}
	if _, err := db.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrate with writers: %v", err)
	}
	// Let the writers go on under the triggers for a moment too.
	if _, err := pool.Exec(ctx, `SELECT pg_sleep(0.2)`); err != nil {
		t.Fatal(err)
	}
	stop()
	wg.Wait()
	var wrong, rows int
	if err := pool.QueryRow(ctx, `
		WITH exact AS (SELECT topic, status, count(*) AS n FROM outbox_event WHERE status IN ('pending', 'dead') GROUP BY 1, 2),
		     kept AS (SELECT topic, status, sum(n) AS n FROM outbox_backlog_count GROUP BY 1, 2 HAVING sum(n) <> 0)
		SELECT (SELECT count(*) FROM exact FULL JOIN kept USING (topic, status) WHERE exact.n IS DISTINCT FROM kept.n),
		       (SELECT count(*) FROM exact)`).Scan(&wrong, &rows); err != nil {
		t.Fatal(err)
	}
	if writes.Load() == 0 {
		t.Fatal("the writers wrote nothing: the test proved nothing")
	}
	if wrong != 0 || rows == 0 {
		t.Fatalf("%d of %d (topic, status) counts differ from count(*) after the migration", wrong, rows)
	}
}
