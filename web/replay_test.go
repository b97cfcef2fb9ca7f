package web_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/outbox/outboxtest"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// POST /outbox/replay: the dry run counts the published events of the
// filter, lists a sample, says the ids are kept and how many are older than
// the inbox's retention, and changes nothing; the confirmation opens a
// durable job (audited, for one consumer) that survives the console
// stopping mid-job: another console finishes it, no event replayed twice.
func TestReplayDryRunThenJobSurvivesAConsoleRestart(t *testing.T) {
	t.Parallel()
	var chunks atomic.Int64
	stopped := make(chan struct{})
	h := start(t, options{jobHook: func(ctx context.Context, _ pgx.Tx, j outbox.Job, _ []uuid.UUID) error {
		if j.Kind == outbox.JobReplay && chunks.Add(1) == 3 {
			close(stopped)
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}})
	const recent, old = 4900, 100
	outboxtest.Insert(t, h.pool, outboxtest.Seed{N: old, Topic: "orders", AggregateType: "order", AggregateID: "old-{n}",
		Status: "published", Age: 10 * 24 * time.Hour})
	outboxtest.Insert(t, h.pool, outboxtest.Seed{N: recent, Topic: "orders", AggregateType: "order", AggregateID: "o-{n}",
		Status: "published", Age: time.Hour})
	outboxtest.Insert(t, h.pool, outboxtest.Seed{N: 5, Topic: "orders", Status: "dead"}) // not published: not replayed
	b, token := h.signedIn(t, "oncall")
	before := outboxState(t, h)

	form := url.Values{"topic": {"orders"}, "reason": {"billing restored from backup"}, "consumer": {"billing"}}
	dry := url.Values{"dry_run": {"1"}}
	for k, v := range form {
		dry[k] = v
	}
	resp, body := b.postForm(t, h.base+"/outbox/replay", token, dry)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("dry run: %d %s", resp.StatusCode, body)
	}
	d := doc(t, body)
	if got := d.Find(`[data-testid="bulk-count"]`).Text(); got != "5,000" {
		t.Errorf("dry run count %q, want 5,000", got)
	}
	if n := d.Find(`[data-testid="bulk-sample"] li`).Length(); n != 20 {
		t.Errorf("sample of %d, want 20", n)
	}
	notes := d.Find(`[data-testid="replay-notes"]`).Text()
	if !strings.Contains(notes, "original id") || d.Find(`[data-testid="replay-consumer"]`).Text() != "billing" ||
		!strings.Contains(d.Find(`[data-testid="replay-older"]`).Text(), "100 of these events") {
		t.Errorf("replay notes: %s", notes)
	}
	if outboxState(t, h) != before || h.countAudit(t, `action LIKE 'outbox.bulk.%'`) != 0 {
		t.Fatal("the dry run changed something")
	}
	confirm := url.Values{}
	d.Find(`[data-testid="bulk-confirm-form"] input[type="hidden"]`).Each(func(_ int, s *goquery.Selection) {
		confirm.Set(s.AttrOr("name", ""), s.AttrOr("value", ""))
	})
	if action, _ := d.Find(`[data-testid="bulk-confirm-form"]`).Attr("action"); action != "/outbox/replay" || confirm.Get("consumer") != "billing" {
		t.Fatalf("confirmation form posts to %q with %v", action, confirm)
	}
	resp, body = b.postForm(t, h.base+"/outbox/replay", token, confirm)
	m := jobLocation.FindStringSubmatch(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusSeeOther || m == nil {
		t.Fatalf("confirm: %d %q %s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	id := uuid.MustParse(m[1])
	if n := h.countAudit(t, `action = 'outbox.bulk.create' AND target_id = $1 AND after->>'kind' = 'replay' AND after->>'replay_to' = 'billing'
		AND reason = 'billing restored from backup'`, id.String()); n != 1 {
		t.Fatalf("%d audit rows open the replay job, want 1", n)
	}

	<-stopped
	if err := h.app.Close(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the stopped console to give the job back", func() (bool, error) {
		j, err := outbox.GetJob(context.Background(), h.pool, id)
		return err == nil && j.Done == 2*outbox.DefaultJobChunk && j.State == outbox.JobRunning, err
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h.startAnother(t, ctx)
	j := waitJob(t, h, id, outbox.JobDone)
	if j.Done != recent+old || j.Skipped != 0 || j.ReplayTo != "billing" {
		t.Fatalf("job %+v, want %d replayed to billing", j, recent+old)
	}
	var replayed, wrong int
	if err := h.pool.QueryRow(context.Background(), `
		SELECT count(*) FILTER (WHERE replay_count = 1 AND replay_to = 'billing' AND status = 'pending'),
		       count(*) FILTER (WHERE replay_count > 1 OR (status = 'dead') <> (replay_count = 0))
		  FROM outbox_event`).Scan(&replayed, &wrong); err != nil || replayed != recent+old || wrong != 0 {
		t.Fatalf("%d events replayed to billing, %d wrong (%v)", replayed, wrong, err)
	}
	checkJobAudit(t, h, id, "orders", outbox.JobDone)
}

// A replay needs a reason and a usable consumer name; a viewer and a
// request without CSRF token are refused; none changes anything.
func TestReplayRefusals(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	outboxtest.Insert(t, h.pool, outboxtest.Seed{N: 3, Topic: "orders", Status: "published"})
	before := outboxState(t, h)
	oncall, token := h.signedIn(t, "oncall")
	for _, c := range []struct {
		form  url.Values
		field string
	}{
		{url.Values{"dry_run": {"1"}, "topic": {"orders"}}, "reason"},
		{url.Values{"dry_run": {"1"}, "topic": {"orders"}, "reason": {"x"}, "consumer": {"two words"}}, "consumer"},
		{url.Values{"topic": {"orders"}, "reason": {"x"}}, ""}, // no dry run, no confirmed count
	} {
		resp, body := oncall.postForm(t, h.base+"/outbox/replay", token, c.form)
		if resp.StatusCode != http.StatusUnprocessableEntity {
			t.Errorf("%v: %d, want 422", c.form, resp.StatusCode)
		}
		if c.field != "" && doc(t, body).Find(`[data-testid="bulk-error-`+c.field+`"]`).Length() != 1 {
			t.Errorf("%v: no error on %s", c.form, c.field)
		}
	}
	if resp, _ := oncall.postForm(t, h.base+"/outbox/replay", "", url.Values{"dry_run": {"1"}, "topic": {"orders"}, "reason": {"x"}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("replay without CSRF: %d", resp.StatusCode)
	}
	support, stoken := h.signedIn(t, "support")
	if resp, _ := support.postForm(t, h.base+"/outbox/replay", stoken, url.Values{"topic": {"orders"}, "reason": {"x"}, "expect": {"3"}, "seen_at": {time.Now().UTC().Format(time.RFC3339Nano)}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("viewer replay: %d", resp.StatusCode)
	}
	if n := h.countAudit(t, `action = 'request.denied' AND target_id = 'POST /outbox/replay' AND actor_name = 'support'`); n != 1 {
		t.Errorf("%d audited viewer refusals, want 1", n)
	}
	if outboxState(t, h) != before || h.countAudit(t, `action LIKE 'outbox.bulk.%'`) != 0 {
		t.Error("a refused replay changed something")
	}
	// The job page says whom a replay is for.
	resp, body := oncall.postForm(t, h.base+"/outbox/replay", token, url.Values{"topic": {"orders"}, "reason": {"x"}, "consumer": {"billing"}, "expect": {"3"}, "seen_at": {time.Now().UTC().Format(time.RFC3339Nano)}})
	m := jobLocation.FindStringSubmatch(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusSeeOther || m == nil {
		t.Fatalf("confirm: %d %s", resp.StatusCode, body)
	}
	_, page := oncall.get(t, h.base+"/jobs/"+m[1], "text/html")
	if got := doc(t, page).Find(`[data-testid="job-replay-to"]`).Text(); !strings.Contains(got, "consumer billing only") {
		t.Errorf("the job page says it replays to %q", got)
	}
}
