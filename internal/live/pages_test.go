package live_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/outbox/outboxtest"
	"github.com/sluice-dev/sluice/internal/testkit"
)

func drain(c *live.Client) string {
	var b strings.Builder
	for {
		select {
		case m := <-c.Messages():
			b.Write(m)
		default:
			return b.String()
		}
	}
}

// Each socket gets its own page's fragments only, the full page state
// first; a fragment no longer rendered is forgotten (a new subscriber does
// not get it). The snapshot carries the unfinished and newest jobs.
func TestPagesGetTheirOwnFragments(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	outboxtest.Insert(t, pool, outboxtest.Seed{N: 3, Topic: "t", Status: "dead"})
	job, err := db.WithTxV(ctx, pool, func(tx pgx.Tx) (outbox.Job, error) {
		return outbox.CreateJob(ctx, tx, outbox.JobRequest{Kind: outbox.JobRetry, RequestedBy: "op"})
	})
	if err != nil {
		t.Fatal(err)
	}
	var jobs [][]live.JobProgress
	f := live.New(constQuerier{pool}, nil, live.Config{Render: func(s live.Snapshot, _ []live.Snapshot) ([]live.Fragment, error) {
		jobs = append(jobs, s.Jobs)
		out := []live.Fragment{{ID: "tiles", HTML: []byte(`<div id="tiles">` + s.At.String() + `</div>`)}}
		for _, j := range s.Jobs {
			if !j.Finished() {
				out = append(out, live.Fragment{Page: live.PageJobs, ID: j.ID.String(), HTML: []byte(`<div id="` + j.ID.String() + `">` + j.State + `</div>`)})
			}
		}
		return out, nil
	}})
	if err := f.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if len(jobs[0]) != 1 || jobs[0][0].ID != job.ID || jobs[0][0].State != outbox.JobPending || jobs[0][0].Matched != 3 {
		t.Fatalf("snapshot jobs %+v, want the pending job matching 3", jobs[0])
	}
	dash := f.Subscribe("s1")
	page := f.SubscribePage("s1", live.PageJobs)
	if d, p := drain(dash), drain(page); !strings.Contains(d, `id="tiles"`) || strings.Contains(d, job.ID.String()) ||
		!strings.Contains(p, job.ID.String()+`">pending`) || strings.Contains(p, "tiles") {
		t.Fatalf("first state: dashboard %q, jobs page %q", d, p)
	}
	if _, err := pool.Exec(ctx, `UPDATE outbox_job SET state = 'done', finished_at = now() WHERE id = $1`, job.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if got := jobs[1]; len(got) != 1 || got[0].State != outbox.JobDone {
		t.Fatalf("a job that has just ended: %+v, want it listed as done", got)
	}
	if p := drain(page); p != "" {
		t.Fatalf("jobs page got %q for a dashboard-only change", p)
	}
	if late := drain(f.SubscribePage("s2", live.PageJobs)); late != "" {
		t.Fatalf("a new jobs subscriber got %q: the fragment no longer rendered was kept", late)
	}
}

// The outbox pages have no fragment: their client gets an empty message on
// subscribe (once a snapshot was read) and on every tick, even one that
// changed no fragment, never another page's fragments.
func TestOutboxPageGetsTicksNotFragments(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	f := live.New(constQuerier{pool}, nil, live.Config{Render: func(live.Snapshot, []live.Snapshot) ([]live.Fragment, error) {
		return []live.Fragment{{ID: "tiles", HTML: []byte(`<div id="tiles"></div>`)}}, nil
	}})
	early := f.SubscribePage("s1", live.PageOutbox)
	if n := len(early.Messages()); n != 0 {
		t.Fatalf("%d messages before the first snapshot", n)
	}
	if err := f.Step(ctx); err != nil {
		t.Fatal(err)
	}
	late := f.SubscribePage("s1", live.PageOutbox)
	if err := f.Step(ctx); err != nil { // the same fragments: nothing for the dashboard
		t.Fatal(err)
	}
	for _, c := range []*live.Client{early, late} {
		n := len(c.Messages())
		if got := drain(c); n != 2 || got != "" {
			t.Fatalf("outbox client: %d messages %q, want 2 empty", n, got)
		}
	}
}

// Poke reads a snapshot before the tick.
func TestPokeWakesThePollerEarly(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	f := live.New(pool, nil, live.Config{Interval: time.Hour, MinInterval: time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Run(ctx) }()
	testkit.Until(t, "three snapshots within an hour's interval", func() bool {
		f.Poke()
		_, ticks := f.Stats()
		return ticks >= 3
	})
	cancel()
	<-done
}
