package outbox

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// planNode is the part of an EXPLAIN (ANALYZE, FORMAT JSON) node the plan
// tests read.
type planNode struct {
	NodeType string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Index    string     `json:"Index Name"`
	Rows     float64    `json:"Actual Rows"`
	Loops    float64    `json:"Actual Loops"`
	Plans    []planNode `json:"Plans"`
}

// walk calls f on n and every node under it.
func (n planNode) walk(f func(planNode)) {
	f(n)
	for _, c := range n.Plans {
		c.walk(f)
	}
}

// Issue 12, goal 6: the backlog read never scans the backlog. With 20,000
// pending events over two topics, the plan reads at most the head of each
// topic (BacklogHead rows) from outbox_event, and the counts still say
// 20,000. Asserted on the plan's actual rows, not on time. The small topic's
// events all come after the big one's (a paused topic's backlog at the head
// of claim order looks like this): walking outbox_event_pending_idx in id
// order and filtering by topic would read all 18,000 to reach them.
func TestBacklogReadsOnlyEachTopicsHead(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	const pending = 20000
	_, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, created_at,
		                          locked_until, lock_token)
		SELECT (lpad(to_hex($2::bigint + g), 12, '0') || '7' || substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid,
		       'plan', 'a' || g, 1, CASE WHEN g <= $1 * 9 / 10 THEN 'big' ELSE 'small' END, 'plan.v1', '{}'::jsonb,
		       now() - interval '1 hour' + g * interval '1 ms',
		       CASE WHEN g <= 10 THEN now() + interval '1 hour' END, CASE WHEN g <= 10 THEN gen_random_uuid() END
		  FROM generate_series(1, $1) g`, pending, time.Now().Add(-time.Hour).UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
	// Dead letters and history too: the read must not count them either.
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, dead_at, published_at)
		SELECT gen_random_uuid(), 'old', 'o' || g, 1, 'small', 'plan.v1', '{}'::jsonb,
		       CASE WHEN g % 10 = 0 THEN 'dead' ELSE 'published' END, now(), now()
		  FROM generate_series(1, 5000) g`); err != nil {
		t.Fatal(err)
	}
	// An event of the small topic two hours older than the rest, as a held
	// one is: with a cursor, the read remembers it and probes it by id.
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, created_at)
		VALUES ($1, 'held', 'h', 1, 'small', 'plan.v1', '{}'::jsonb, now() - interval '2 hours')`, idAt(time.Now().Add(-2*time.Hour))); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE outbox_event`); err != nil {
		t.Fatal(err)
	}
	// Without a cursor; with one after a first read (the feed's, each tick
	// after its first): the remembered event probed through an index on id,
	// each topic's walk from its first pending event.
	cursor := &BacklogCursor{FullWalk: time.Hour}
	for _, r := range []*BacklogRead{{}, {Cursor: cursor}, {Cursor: cursor}} {
		sql, args := db.Compose(r)
		var raw []byte
		if err := pool.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+sql, args...).Scan(&raw); err != nil {
			t.Fatal(err)
		}
		var plans []struct {
			Plan planNode `json:"Plan"`
		}
		if err := json.Unmarshal(raw, &plans); err != nil {
			t.Fatal(err)
		}
		var read float64
		plans[0].Plan.walk(func(n planNode) {
			if n.Relation != "outbox_event" {
				return
			}
			switch n.Index {
			case "outbox_event_pending_topic_idx", "outbox_event_pending_idx", "outbox_event_pkey":
			default:
				t.Errorf("the backlog read scans outbox_event with %s %s, not the pending topic index or an id index", n.NodeType, n.Index)
			}
			read += n.Rows * n.Loops
		})
		if read == 0 || read > 2*BacklogHead {
			t.Fatalf("the backlog read took %.0f rows from outbox_event, want 1 to %d (each topic's head):\n%s", read, 2*BacklogHead, raw)
		}
		if _, err := db.ReadAll(ctx, pool, r); err != nil { // the cursor moves as the feed's does
			t.Fatal(err)
		}
		b := r.Backlog
		if b.Pending != pending+1 || b.Dead != 500 || b.InFlight != 10 || len(b.Topics) != 2 || b.OldestPendingAge < 119*time.Minute {
			t.Fatalf("backlog %+v, want %d pending over 2 topics, 10 in flight, 500 dead, two hours old", b, pending+1)
		}
	}
	cursor.mu.Lock()
	defer cursor.mu.Unlock()
	if small := cursor.topics["small"]; len(small.Stuck) != 1 {
		t.Fatalf("the cursor of the small topic is %+v: want the two-hour-old event remembered", small)
	}
}
