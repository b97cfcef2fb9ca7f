package live_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// A dead letter holding two later events of its aggregate: the snapshot, the
// page-time outbox read and sluice_outbox_held say the same.
func TestSnapshotCountsEventsHeldBehindDeadLetters(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		for _, agg := range []string{"a", "a", "a", "b"} {
			if _, err := outbox.Insert(ctx, tx, outbox.Event{AggregateType: "t", AggregateID: agg, Topic: "x",
				EventType: "t.v1", Payload: json.RawMessage(`{}`)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE outbox_event SET status = 'dead', dead_at = now()
	      WHERE aggregate_id = 'a' AND aggregate_seq = (SELECT min(aggregate_seq) FROM outbox_event WHERE aggregate_id = 'a')`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := outbox.RecountBacklog(ctx, pool); err != nil { // a status changed by hand
		t.Fatal(err)
	}
	want := outbox.Held{Events: 2, Aggregates: 1}
	s, err := live.ReadSnapshot(ctx, pool, time.Time{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	o, err := live.ReadOutbox(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if s.Held != want || o.Held != want || o.Dead != 1 || o.Pending != 3 || len(o.RecentDead) != 1 {
		t.Fatalf("snapshot held %+v, outbox read %+v; want %+v", s.Held, o, want)
	}

	f := live.New(pool, nil, live.Config{})
	reg := prometheus.NewRegistry()
	if err := f.Register(reg); err != nil {
		t.Fatal(err)
	}
	if err := f.Step(ctx); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		if name := mf.GetName(); name == "sluice_outbox_held" || name == "sluice_outbox_held_partial" {
			for _, m := range mf.GetMetric() {
				got = append(got, fmt.Sprintf("%s=%v", name, m.GetGauge().GetValue()))
			}
		}
	}
	if strings.Join(got, ",") != "sluice_outbox_held=2,sluice_outbox_held_partial=0" {
		t.Fatalf("held gauges %v, want sluice_outbox_held 2, exact", got)
	}
}

// A topic whose backlog drains keeps its sluice_outbox_backlog series at 0:
// a graph or an alert sees the drain, not a vanished series.
func TestBacklogOfADrainedTopicStaysAtZero(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Insert(ctx, tx, outbox.Event{AggregateType: "t", AggregateID: "a", Topic: "drains",
			EventType: "t.v1", Payload: json.RawMessage(`{}`)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	f := live.New(pool, nil, live.Config{})
	reg := prometheus.NewRegistry()
	if err := f.Register(reg); err != nil {
		t.Fatal(err)
	}
	backlog := func() string {
		t.Helper()
		if err := f.Step(ctx); err != nil {
			t.Fatal(err)
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, mf := range mfs {
			if mf.GetName() == "sluice_outbox_backlog" {
				for _, m := range mf.GetMetric() {
					got = append(got, fmt.Sprintf("%s=%v", m.GetLabel()[0].GetValue(), m.GetGauge().GetValue()))
				}
			}
		}
		return strings.Join(got, ",")
	}
	if got := backlog(); got != "drains=1" {
		t.Fatalf("backlog %q, want drains=1", got)
	}
	if _, err := pool.Exec(ctx, `UPDATE outbox_event SET status = 'published', published_at = now()`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := outbox.RecountBacklog(ctx, pool); err != nil { // statuses changed by hand
		t.Fatal(err)
	}
	if got := backlog(); got != "drains=0" {
		t.Fatalf("backlog after the drain %q, want drains=0", got)
	}
}
