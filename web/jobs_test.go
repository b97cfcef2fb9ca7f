package web_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/demo/devoidc"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/outbox/outboxtest"
	"github.com/sluice-dev/sluice/internal/testkit"
	"github.com/sluice-dev/sluice/web"
)

// seedDeadEvents writes n dead events on topic, one per aggregate, with
// time-ordered ids an hour old.
func seedDeadEvents(t *testing.T, h *harness, topic string, n int) {
	t.Helper()
	outboxtest.Insert(t, h.pool, outboxtest.Seed{N: n, Topic: topic, AggregateType: "job", AggregateID: topic + "-{n}",
		EventType: "job.v1", Status: "dead", Attempts: 10, Age: time.Hour})
}

// outboxState is a digest of every event's id and status.
func outboxState(t *testing.T, h *harness) string {
	t.Helper()
	var s string
	if err := h.pool.QueryRow(context.Background(), `SELECT coalesce(md5(string_agg(id::text || status || attempts, ',' ORDER BY id)), '') FROM outbox_event`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// postForm posts form as a same-origin browser would (with the page's CSRF
// token when token is not empty), without following redirects, and returns
// the response with its body read.
func (b *browser) postForm(t *testing.T, u, token string, form url.Values) (*http.Response, string) {
	t.Helper()
	if token != "" {
		form.Set("csrf_token", token)
	}
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "text/html")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := b.noRedirects().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(data)
}

var jobLocation = regexp.MustCompile(`^/jobs/([0-9a-f-]{36})$`)

// confirmBulk runs the dry run of form, then confirms its count, and
// returns the job id the console redirected to.
func (h *harness) confirmBulk(t *testing.T, b *browser, token string, form url.Values) uuid.UUID {
	t.Helper()
	dry := url.Values{"dry_run": {"1"}}
	for k, v := range form {
		dry[k] = v
	}
	resp, body := b.postForm(t, h.base+"/outbox/bulk", token, dry)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("dry run: %d %s", resp.StatusCode, body)
	}
	confirm := url.Values{}
	doc(t, body).Find(`[data-testid="bulk-confirm-form"] input[type="hidden"]`).Each(func(_ int, s *goquery.Selection) {
		confirm.Set(s.AttrOr("name", ""), s.AttrOr("value", ""))
	})
	if confirm.Get("expect") == "" {
		t.Fatalf("the dry run has no confirmation form: %s", body)
	}
	resp, body = b.postForm(t, h.base+"/outbox/bulk", token, confirm)
	m := jobLocation.FindStringSubmatch(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusSeeOther || m == nil {
		t.Fatalf("confirm: %d %q %s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	return uuid.MustParse(m[1])
}

func waitJob(t *testing.T, h *harness, id uuid.UUID, state string) outbox.Job {
	t.Helper()
	var j outbox.Job
	testkit.Eventually(t, "job "+state, func() (bool, error) {
		var err error
		j, err = outbox.GetJob(context.Background(), h.pool, id)
		return err == nil && j.State == state, err
	})
	return j
}

// checkJobAudit: one row opens the job, the chunk rows' ids are disjoint
// and together exactly the events of topic, one row closes it as end; the
// chain is intact.
func checkJobAudit(t *testing.T, h *harness, id uuid.UUID, topic, end string) {
	t.Helper()
	ctx := context.Background()
	if n := h.countAudit(t, `action = 'outbox.bulk.create' AND outcome = 'ok' AND target_id = $1 AND actor_sub <> ''`, id.String()); n != 1 {
		t.Errorf("%d rows open the job, want 1", n)
	}
	if n := h.countAudit(t, `action LIKE 'outbox.bulk.%' AND action IN ('outbox.bulk.done', 'outbox.bulk.cancelled', 'outbox.bulk.failed') AND target_id = $1`, id.String()); n != 1 {
		t.Errorf("%d rows close the job, want 1", n)
	}
	if n := h.countAudit(t, `action = $2 AND target_id = $1`, id.String(), "outbox.bulk."+end); n != 1 {
		t.Errorf("no %s row closes the job", end)
	}
	var ids, distinct, counted, outside, missing int
	err := h.pool.QueryRow(ctx, `
		WITH c AS (SELECT (after->>'count')::int AS n, after->'ids' AS ids FROM audit_event
		            WHERE action = 'outbox.bulk.chunk' AND target_id = $1),
		     i AS (SELECT jsonb_array_elements_text(ids)::uuid AS id FROM c)
		SELECT (SELECT count(*) FROM i), (SELECT count(DISTINCT id) FROM i), (SELECT coalesce(sum(n), 0) FROM c),
		       (SELECT count(*) FROM i JOIN outbox_event e USING (id) WHERE e.topic <> $2),
		       (SELECT count(*) FROM outbox_event e WHERE e.topic = $2 AND e.status <> 'dead' AND NOT EXISTS (SELECT 1 FROM i WHERE i.id = e.id))`,
		id.String(), topic).Scan(&ids, &distinct, &counted, &outside, &missing)
	if err != nil {
		t.Fatal(err)
	}
	j, err := outbox.GetJob(ctx, h.pool, id)
	if err != nil {
		t.Fatal(err)
	}
	if ids != distinct || int64(ids) != j.Done || counted != ids || outside != 0 || missing != 0 {
		t.Errorf("chunk audit: %d ids (%d distinct, counts say %d), job done %d, %d outside the filter, %d changed but not audited",
			ids, distinct, counted, j.Done, outside, missing)
	}
	v, err := audit.Verify(ctx, h.pool)
	if err != nil || !v.Intact() {
		t.Errorf("audit chain: %+v %v", v, err)
	}
}

// A dry run changes nothing and shows the count (up to its cap: more than
// 10,000) and a sample; the confirmed job retries all 20,000 dead events in
// chunks through the console's runner, with one audit row opening it, one
// per chunk and one closing it.
func TestBulkRetryDryRunThenJobInChunks(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	const n = 20_000
	seedDeadEvents(t, h, "bulk", n)
	seedDeadEvents(t, h, "other", 10)
	b, token := h.signedIn(t, "oncall")

	// The form page, filled from the list's query.
	_, body := b.get(t, h.base+"/outbox/bulk?status=dead&topic=bulk&action=retry", "text/html")
	if d := doc(t, body); d.Find(`[data-testid="bulk-form"]`).Length() != 1 || d.Find(`[data-testid="bulk-topic"]`).AttrOr("value", "") != "bulk" {
		t.Fatalf("bulk form not filled from the query: %s", body)
	}

	before := outboxState(t, h)
	resp, body := b.postForm(t, h.base+"/outbox/bulk", token, url.Values{"dry_run": {"1"}, "status": {"dead"}, "topic": {"bulk"}, "action": {"retry"}})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("dry run: %d %s", resp.StatusCode, body)
	}
	d := doc(t, body)
	if got := d.Find(`[data-testid="bulk-count"]`).Text(); !strings.HasPrefix(got, "more than 10,000") {
		t.Errorf("dry run count %q, want more than 10,000", got)
	}
	if got := d.Find(`[data-testid="bulk-filter"]`).Text(); got != `dead events on topic "bulk"` {
		t.Errorf("filter in words %q", got)
	}
	var first []string
	rows, err := h.pool.Query(context.Background(), `SELECT id::text FROM outbox_event WHERE topic = 'bulk' ORDER BY id LIMIT 20`)
	if err != nil {
		t.Fatal(err)
	}
	if first, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	var sample []string
	d.Find(`[data-testid="bulk-sample"] code`).Each(func(_ int, s *goquery.Selection) { sample = append(sample, s.Text()) })
	if strings.Join(sample, ",") != strings.Join(first, ",") {
		t.Errorf("sample %v, want the first 20 ids %v", sample, first)
	}
	if !strings.Contains(d.Find(`[data-testid="bulk-confirm"]`).Text(), "more than 10,000") {
		t.Errorf("the confirmation does not name the count: %q", d.Find(`[data-testid="bulk-confirm"]`).Text())
	}
	if after := outboxState(t, h); after != before {
		t.Fatal("the dry run changed the outbox")
	}
	if n := h.countAudit(t, `action LIKE 'outbox.bulk.%'`); n != 0 {
		t.Fatalf("the dry run wrote %d audit rows", n)
	}

	id := h.confirmBulk(t, b, token, url.Values{"status": {"dead"}, "topic": {"bulk"}, "action": {"retry"}})
	j := waitJob(t, h, id, outbox.JobDone)
	if j.MatchedMoreThan != outbox.JobCountExactBelow || j.Done != n || j.Skipped != 0 || j.RequestedBy != "oncall" {
		t.Fatalf("job %+v, want more than %d matched and %d retried by oncall", j, outbox.JobCountExactBelow, n)
	}
	var pending, dead int
	if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE status = 'pending' AND topic = 'bulk'), count(*) FILTER (WHERE status = 'dead') FROM outbox_event`).Scan(&pending, &dead); err != nil {
		t.Fatal(err)
	}
	if pending != n || dead != 10 {
		t.Fatalf("%d retried, %d still dead; want %d and the 10 outside the filter", pending, dead, n)
	}
	if chunks := h.countAudit(t, `action = 'outbox.bulk.chunk' AND target_id = $1`, id.String()); chunks != n/outbox.DefaultJobChunk {
		t.Errorf("%d chunk rows, want %d", chunks, n/outbox.DefaultJobChunk)
	}
	checkJobAudit(t, h, id, "bulk", outbox.JobDone)

	// The pages: the list names it, the detail shows a full bar and no
	// cancel button.
	_, body = b.get(t, h.base+"/jobs", "text/html")
	if d := doc(t, body); d.Find(`[data-testid="job-row"]`).Length() != 1 || !strings.Contains(d.Find(`[data-testid="job-row"]`).Text(), `on topic "bulk"`) {
		t.Errorf("jobs list: %s", body)
	}
	resp, body = b.get(t, h.base+"/jobs/"+id.String(), "text/html")
	d = doc(t, body)
	bar := d.Find(`[data-testid="job-progress"]`)
	if resp.StatusCode != 200 || bar.AttrOr("value", "") != "20000" || bar.AttrOr("max", "") != "20000" ||
		d.Find(`[data-testid="job-state"]`).Text() != "done" || d.Find(`[data-testid="job-cancel"]`).Length() != 0 {
		t.Errorf("job page %d: %s", resp.StatusCode, body)
	}
	for _, u := range []string{"/jobs/" + uuid.NewString(), "/jobs/not-a-uuid"} {
		if resp, _ := b.get(t, h.base+u, "text/html"); resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", u, resp.StatusCode)
		}
	}
	waitMetrics(t, h, b, `sluice_console_bulk_jobs{state="pending"} 0`, `sluice_console_bulk_jobs{state="running"} 0`)
}

// waitMetrics waits until /metrics (from the live snapshot) has lines.
func waitMetrics(t *testing.T, h *harness, b *browser, lines ...string) {
	t.Helper()
	testkit.Until(t, fmt.Sprint("metrics ", lines), func() bool {
		_, metrics := b.get(t, h.base+"/metrics", "")
		for _, l := range lines {
			if !strings.Contains(metrics, l+"\n") {
				return false
			}
		}
		return true
	})
}

// startAnother starts a second console on h's database and provider.
func (h *harness) startAnother(t *testing.T, ctx context.Context) *web.App {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rm, err := auth.ParseRoleMap(devoidc.DemoRoleMap)
	if err != nil {
		t.Fatal(err)
	}
	app, err := web.New(ctx, web.Config{PublicURL: "http://" + ln.Addr().String(), OIDCIssuer: h.idp.Issuer(),
		OIDCClientID: "console", OIDCClientSecret: "console-secret", RolesClaim: "groups", RoleMap: rm,
		Tick: 200 * time.Millisecond}, web.Deps{Pool: h.pool, Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx) }()
	t.Cleanup(func() {
		_ = app.Close()
		if err := <-done; err != nil {
			t.Errorf("second console: %v", err)
		}
	})
	return app
}

// A console stopped in the middle of a job gives it back; another console
// on the same database finishes it: no event done twice, none skipped.
func TestBulkJobResumesOnAnotherConsole(t *testing.T) {
	t.Parallel()
	var chunks atomic.Int64
	stopped := make(chan struct{})
	h := start(t, options{jobHook: func(ctx context.Context, _ pgx.Tx, _ outbox.Job, _ []uuid.UUID) error {
		if chunks.Add(1) == 6 {
			// The sixth chunk is in its transaction when the console
			// stops: it rolls back.
			close(stopped)
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}})
	const n = 20_000
	seedDeadEvents(t, h, "bulk", n)
	b, token := h.signedIn(t, "admin")
	id := h.confirmBulk(t, b, token, url.Values{"topic": {"bulk"}, "action": {"discard"}, "reason": {"poison batch"}})
	<-stopped
	if err := h.app.Close(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the stopped console to give the job back", func() (bool, error) {
		j, err := outbox.GetJob(context.Background(), h.pool, id)
		return err == nil && j.Done == 5*outbox.DefaultJobChunk && j.State == outbox.JobRunning, err
	})
	if n := h.countAudit(t, `action = 'outbox.bulk.chunk' AND target_id = $1`, id.String()); n != 5 {
		t.Fatalf("%d chunk rows after the stop, want the 5 committed", n)
	}

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h.startAnother(t, ctx)
	j := waitJob(t, h, id, outbox.JobDone)
	if j.Done != n || j.Skipped != 0 {
		t.Fatalf("job %+v, want %d discarded", j, n)
	}
	var discarded int
	if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_event WHERE status = 'discarded' AND discard_reason = 'poison batch'`).Scan(&discarded); err != nil || discarded != n {
		t.Fatalf("%d discarded (%v), want %d", discarded, err, n)
	}
	checkJobAudit(t, h, id, "bulk", outbox.JobDone)
}

// A cancel stops a running job before its next chunk; cancelling an ended
// job is a 409 that says so. The second chunk is paused while the cancel
// is sent, then fails (the runner gives the job back for its retry delay),
// so the cancel is committed before any further chunk can run: a chunk
// that commits after the cancel would be a bug, never a lost race.
func TestCancelStopsARunningJob(t *testing.T) {
	t.Parallel()
	var chunks atomic.Int64
	inChunk, release := make(chan struct{}), make(chan struct{})
	h := start(t, options{jobHook: func(ctx context.Context, _ pgx.Tx, _ outbox.Job, _ []uuid.UUID) error {
		if chunks.Add(1) == 2 {
			close(inChunk)
			<-release
			return errors.New("paused by the test")
		}
		return nil
	}})
	seedDeadEvents(t, h, "c", 5000)
	b, token := h.signedIn(t, "oncall")
	id := h.confirmBulk(t, b, token, url.Values{"action": {"retry"}})
	<-inChunk
	waitMetrics(t, h, b, `sluice_console_bulk_jobs{state="running"} 1`)
	type answer struct {
		resp *http.Response
		body string
	}
	got := make(chan answer, 1)
	go func() {
		resp, body := b.postForm(t, h.base+"/jobs/"+id.String()+"/cancel", token, url.Values{})
		got <- answer{resp, body}
	}()
	testkit.Until(t, "the cancel waiting for the chunk in progress", func() bool {
		var waiting bool
		_ = h.pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%UPDATE outbox_job%')`).Scan(&waiting)
		return waiting
	})
	close(release)
	a := <-got
	if a.resp.StatusCode != http.StatusSeeOther || a.resp.Header.Get("Location") != "/jobs/"+id.String() {
		t.Fatalf("cancel: %d %q %s", a.resp.StatusCode, a.resp.Header.Get("Location"), a.body)
	}
	j := waitJob(t, h, id, outbox.JobCancelled)
	if j.Done != outbox.DefaultJobChunk || chunks.Load() != 2 {
		t.Fatalf("cancelled job did %d in %d chunks, want the one chunk committed before the cancel", j.Done, chunks.Load())
	}
	if n := h.countAudit(t, `action = 'outbox.bulk.cancel' AND outcome = 'ok' AND target_id = $1 AND actor_name = 'oncall'`, id.String()); n != 1 {
		t.Errorf("%d cancel rows, want 1", n)
	}
	checkJobAudit(t, h, id, "c", outbox.JobCancelled)

	resp, body := b.postForm(t, h.base+"/jobs/"+id.String()+"/cancel", token, url.Values{})
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "already ended (cancelled)") {
		t.Fatalf("second cancel: %d %s", resp.StatusCode, body)
	}
	if n := h.countAudit(t, `action = 'outbox.bulk.cancel' AND outcome = 'error' AND error_code = 'job_finished' AND target_id = $1`, id.String()); n != 1 {
		t.Errorf("the refused cancel is not audited (%d rows)", n)
	}
}

// A viewer sees no bulk form or jobs and cannot post one (403, audited).
func TestViewerCannotBulk(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	seedDeadEvents(t, h, "v", 3)
	b, token := h.signedIn(t, "support")
	_, body := b.get(t, h.base+"/", "text/html")
	if strings.Contains(body, "/outbox/bulk") || strings.Contains(body, `href="/jobs"`) {
		t.Errorf("a viewer's dashboard offers bulk actions or jobs")
	}
	for _, u := range []string{"/outbox/bulk", "/jobs"} {
		resp, body := b.get(t, h.base+u, "text/html")
		if resp.StatusCode != http.StatusForbidden || strings.Contains(body, "bulk-form") {
			t.Errorf("viewer GET %s: %d", u, resp.StatusCode)
		}
		// The refusal says what is lacking and who has it.
		if want := "the permission to act on outbox events (retry, dead-letter, discard, bulk jobs, pause and replay), which the roles operator and admin have. You are signed in with the role viewer."; !strings.Contains(body, want) {
			t.Errorf("viewer GET %s: the refusal page does not say %q:\n%s", u, want, body)
		}
	}
	before := outboxState(t, h)
	for _, form := range []url.Values{{"dry_run": {"1"}, "action": {"retry"}}, {"action": {"retry"}, "expect": {"3"}}} {
		if resp, body := b.postForm(t, h.base+"/outbox/bulk", token, form); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "roles operator and admin have") {
			t.Errorf("viewer POST /outbox/bulk: %d %q, want 403 saying who may", resp.StatusCode, body)
		}
	}
	if n := h.countAudit(t, `action = 'request.denied' AND error_code = 'permission' AND target_id = 'POST /outbox/bulk' AND actor_name = 'support'`); n != 2 {
		t.Errorf("%d audited refusals, want 2", n)
	}
	if outboxState(t, h) != before || h.countAudit(t, `action LIKE 'outbox.bulk.%'`) != 0 {
		t.Error("a refused bulk changed something")
	}
	conn, resp, err := h.dialPage(t, b, "jobs")
	if err == nil {
		conn.Close()
		t.Fatal("a viewer opened the jobs page's websocket")
	}
	if resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("viewer jobs websocket: %v", resp)
	}
}

func (h *harness) dialPage(t *testing.T, b *browser, page string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	d := websocket.Dialer{HandshakeTimeout: 10 * time.Second, Jar: b.Jar}
	return d.Dial("ws"+strings.TrimPrefix(h.base, "http")+"/ws?page="+page, http.Header{"Origin": {h.base}})
}

// A bulk action over the threshold needs a recent sign-in: with an old one
// the dry run says so and links to a new sign-in, a confirmation is refused
// (audited) and sent to the provider with prompt=login, which comes back to
// the form; then it goes through. A count that grew since the dry run is a
// conflict: nothing changes.
func TestBulkOverThresholdNeedsRecentLogin(t *testing.T) {
	t.Parallel()
	h := start(t, options{configure: func(c *web.Config) { c.BulkRecentLoginAbove = 5; c.RecentLogin = time.Minute }})
	seedDeadEvents(t, h, "big", 10)
	b, token := h.signedIn(t, "oncall")
	if _, err := h.pool.Exec(context.Background(), `UPDATE console_session SET auth_time = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	// Dead-letter applies to pending events: nothing dead matches; the
	// form says what is wrong with a dead status.
	resp, body := b.postForm(t, h.base+"/outbox/bulk", token, url.Values{"dry_run": {"1"}, "status": {"dead"}, "topic": {"big"}, "action": {"dead_letter"}, "reason": {"x"}})
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(doc(t, body).Find(`[data-testid="bulk-problem"]`).Text(), "applies to pending events") {
		t.Fatalf("dead-letter of dead events: %d %s", resp.StatusCode, body)
	}
	if resp, _ := b.postForm(t, h.base+"/outbox/bulk", token, url.Values{"dry_run": {"1"}, "action": {"discard"}}); resp.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("discard without a reason: %d, want 422", resp.StatusCode)
	}
	form := url.Values{"topic": {"big"}, "action": {"retry"}}
	dry := url.Values{"dry_run": {"1"}, "topic": {"big"}, "action": {"retry"}}
	_, body = b.postForm(t, h.base+"/outbox/bulk", token, dry)
	link := doc(t, body).Find(`[data-testid="bulk-reauth-link"]`).AttrOr("href", "")
	if !strings.HasPrefix(link, "/login?reauth=1&next=") || doc(t, body).Find(`[data-testid="bulk-confirm"]`).Length() != 0 {
		t.Fatalf("an old sign-in over the threshold: no re-authentication link: %s", body)
	}
	form.Set("expect", "10")
	form.Set("seen_at", time.Now().UTC().Format(time.RFC3339Nano))
	resp, _ = b.postForm(t, h.base+"/outbox/bulk", token, form)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != link {
		t.Fatalf("confirm with an old sign-in: %d %q, want 303 to %q", resp.StatusCode, resp.Header.Get("Location"), link)
	}
	if n := h.countAudit(t, `action = 'request.denied' AND error_code = 'reauth' AND target_id = 'POST /outbox/bulk'`); n != 1 {
		t.Errorf("%d audited reauth refusals, want 1", n)
	}
	var jobs int
	if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_job`).Scan(&jobs); err != nil || jobs != 0 {
		t.Fatalf("%d jobs after a refusal (%v)", jobs, err)
	}

	// Sign in again: the provider asks for the password (prompt=login) and
	// the console comes back to the form with the filter.
	resp, data := h.signInAt(t, b, h.base+link, "oncall", "oncall")
	if resp.Request.URL.Path != "/outbox/bulk" || resp.Request.URL.Query().Get("topic") != "big" {
		t.Fatalf("re-authentication landed on %s", resp.Request.URL)
	}
	token = csrfField.FindStringSubmatch(data)[1] // a new session, a new token

	// An event that dies after the dry run is not the confirmation's: the
	// job acts on the ten the dry run showed (a reviewer's confirmation
	// sent again a minute later discarded five events no dry run had
	// shown), and the same confirmation sent again makes no second job.
	_, body = b.postForm(t, h.base+"/outbox/bulk", token, dry)
	if doc(t, body).Find(`[data-testid="bulk-confirm"]`).Length() != 1 {
		t.Fatalf("a recent sign-in still cannot confirm: %s", body)
	}
	confirm := url.Values{}
	doc(t, body).Find(`[data-testid="bulk-confirm-form"] input[type="hidden"]`).Each(func(_ int, s *goquery.Selection) {
		confirm.Set(s.AttrOr("name", ""), s.AttrOr("value", ""))
	})
	later := outboxtest.Insert(t, h.pool, outboxtest.Seed{Topic: "big", AggregateType: "job", AggregateID: "one-more", EventType: "job.v1", Status: "dead"})[0]
	id := h.confirmOnly(t, b, token, confirm)
	j := waitJob(t, h, id, outbox.JobDone)
	if j.Matched != 10 || j.Done != 10 {
		t.Fatalf("job %+v: want the 10 the dry run showed", j)
	}
	if st := eventStatus(t, h, later); st != outbox.StatusDead {
		t.Fatalf("an event that died after the dry run is %s, want dead (untouched)", st)
	}
	checkJobAudit(t, h, id, "big", outbox.JobDone)
	resp, _ = b.postForm(t, h.base+"/outbox/bulk", token, confirm)
	if want := "/jobs/" + id.String() + "?done=already"; resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != want {
		t.Fatalf("the confirmation sent again: %d %q, want 303 to %q", resp.StatusCode, resp.Header.Get("Location"), want)
	}
	if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_job`).Scan(&jobs); err != nil || jobs != 1 {
		t.Fatalf("%d jobs after the confirmation was sent again, want 1 (%v)", jobs, err)
	}
	if n := h.countAudit(t, `action = 'outbox.bulk.create' AND outcome = 'error' AND error_code = 'confirmed_already' AND target_id = $1`, id.String()); n != 1 {
		t.Errorf("%d audited refusals of the confirmation sent again, want 1", n)
	}
	if st := eventStatus(t, h, later); st != outbox.StatusDead {
		t.Fatalf("the confirmation sent again reached an event no dry run showed: %s", st)
	}
	_, page := b.get(t, h.base+"/jobs/"+id.String()+"?done=already", "text/html")
	if !strings.Contains(doc(t, page).Find(`[data-testid="notice"]`).Text(), "started this job already") {
		t.Error("the job page does not say the confirmation had started it already")
	}
}

// eventStatus is an event's status now.
func eventStatus(t *testing.T, h *harness, id uuid.UUID) string {
	t.Helper()
	var st string
	if err := h.pool.QueryRow(context.Background(), `SELECT status FROM outbox_event WHERE id = $1`, id).Scan(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

func (h *harness) confirmOnly(t *testing.T, b *browser, token string, form url.Values) uuid.UUID {
	t.Helper()
	resp, body := b.postForm(t, h.base+"/outbox/bulk", token, form)
	m := jobLocation.FindStringSubmatch(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusSeeOther || m == nil {
		t.Fatalf("confirm: %d %s", resp.StatusCode, body)
	}
	return uuid.MustParse(m[1])
}

// In a browser: an operator fills the bulk form, runs the dry run,
// confirms, lands on the job's page and sees its progress bar reach the
// end over the websocket, without a reload.
func TestBrowserBulkRetryShowsLiveProgress(t *testing.T) {
	release := make(chan struct{})
	var chunks atomic.Int64
	h := start(t, options{tick: 250 * time.Millisecond, jobHook: func(ctx context.Context, _ pgx.Tx, _ outbox.Job, _ []uuid.UUID) error {
		if chunks.Add(1) == 1 { // the job waits until the page is open
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}})
	seedDeadEvents(t, h, "bulk", 5000)
	ctx, console := newChrome(t)
	tctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	browserLogin(tctx, t, h, "oncall")
	if err := chromedp.Do(tctx,
		chromedp.Click(chromedp.CSS(`[data-testid="nav-jobs"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="jobs-empty"]`)),
		chromedp.Navigate(h.base+"/outbox/bulk?status=dead&topic=bulk&action=retry"),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="bulk-dry-run"]`)),
		chromedp.Click(chromedp.CSS(`[data-testid="bulk-dry-run"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="bulk-count"]`)),
	); err != nil {
		t.Fatalf("dry run: %v", err)
	}
	if got := text(tctx, t, `[data-testid="bulk-count"]`); got != "5,000" {
		t.Fatalf("dry run count %q", got)
	}
	if err := chromedp.Do(tctx,
		chromedp.Click(chromedp.CSS(`[data-testid="bulk-confirm"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="job-progress"]`)),
	); err != nil {
		t.Fatalf("confirm: %v", err)
	}
	waitJS(tctx, t, "the job page", `/^\/jobs\/[0-9a-f-]{36}$/.test(location.pathname)`)
	waitJS(tctx, t, "websocket open", `document.getElementById('conn').dataset.state === 'open'`)
	if _, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`window.__notReloaded = true`)); err != nil {
		t.Fatal(err)
	}
	if got := text(tctx, t, `[data-testid="job-state"]`); got == "done" {
		t.Fatalf("the job ended before its first chunk was let through")
	}
	close(release)
	waitJS(tctx, t, "the bar at its end", `(function(){var p=document.querySelector('[data-testid="job-progress"]');return p.max===5000&&p.value===5000})()`)
	waitJS(tctx, t, "the state done", `document.querySelector('[data-testid="job-state"]').textContent.trim() === 'done'`)
	waitJS(tctx, t, "no cancel button once ended", `getComputedStyle(document.querySelector('[data-testid="job-cancel-form"]')).display === 'none'`)
	waitJS(tctx, t, "no reload", `window.__notReloaded === true`)
	if png, err := chromedp.Run(tctx, chromedp.CaptureScreenshot()); err == nil {
		_ = os.WriteFile("/tmp/job.png", png, 0o644)
	}
	if p := console.problems(); len(p) > 0 {
		t.Fatalf("browser reported problems: %q", p)
	}
}

// The outbox list hands its filter to the bulk form as it is: one set of
// field names for both.
func TestOutboxListOpensTheBulkFormWithItsFilter(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	outboxtest.Insert(t, h.pool, outboxtest.Seed{Topic: "orders", Status: "dead", Attempts: 5, LastError: "refused"})
	b, _ := h.signedIn(t, "oncall")
	_, body := b.get(t, h.base+"/outbox?status=dead&topic=orders&error_text=refused", "text/html")
	link, ok := doc(t, body).Find(`[data-testid="bulk-link"]`).Attr("href")
	if !ok {
		t.Fatal("the list of an operator has no bulk link")
	}
	resp, form := b.get(t, h.base+link, "text/html")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", link, resp.StatusCode)
	}
	d := doc(t, form)
	if got := d.Find(`[data-testid="bulk-status"] option[selected]`).AttrOr("value", ""); got != "dead" {
		t.Errorf("bulk form status %q, want dead", got)
	}
	for field, want := range map[string]string{"topic": "orders", "error_text": "refused"} {
		if got := d.Find(`[data-testid="bulk-`+field+`"]`).AttrOr("value", ""); got != want {
			t.Errorf("bulk form %s %q, want %q", field, got, want)
		}
	}
	sb, _ := h.signedIn(t, "support")
	_, body = sb.get(t, h.base+"/outbox?status=dead", "text/html")
	if doc(t, body).Find(`[data-testid="bulk-link"]`).Length() != 0 {
		t.Error("a viewer's list offers a bulk action")
	}
}

// An event a bulk job changed shows that job on its page and in its trace,
// as a single action's audit row does: before, a bulk retry, discard or
// replay left the page reading "No console action has touched this event".
// The actor is the person who asked for the job, the row links to the job
// for those who may open it, and the timeline reads the bulk retry as the
// retry it was (an earlier death, then the attempts since it).
func TestEventPagesShowTheBulkJobsThatChangedThem(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	seedDeadEvents(t, h, "bj", 3)
	seedDeadEvents(t, h, "untouched", 1)
	outboxtest.Insert(t, h.pool, outboxtest.Seed{N: 2, Topic: "rp", AggregateType: "order", AggregateID: "rp-{n}",
		Status: "published", Age: time.Hour})
	b, token := h.signedIn(t, "oncall")
	ctx := context.Background()
	idsOf := func(topic string) []string {
		t.Helper()
		rows, err := h.pool.Query(ctx, `SELECT id::text FROM outbox_event WHERE topic = $1 ORDER BY id`, topic)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	retried, untouched, replayed := idsOf("bj"), idsOf("untouched")[0], idsOf("rp")

	retryJob := h.confirmBulk(t, b, token, url.Values{"status": {"dead"}, "topic": {"bj"}, "action": {"retry"}, "reason": {"broker fixed"}})
	waitJob(t, h, retryJob, outbox.JobDone)
	// Then one of them is dead-lettered by hand: the timeline puts the
	// job's retry before the attempts line and the operator's action after.
	if resp, body := h.postForm(t, b, "/outbox/"+retried[0]+"/dead-letter",
		url.Values{"csrf_token": {token}, "expected": {"pending"}, "reason": {"bad payload"}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("dead-letter: %d %s", resp.StatusCode, body)
	}
	replayJob := h.confirmBulk(t, b, token, url.Values{"topic": {"rp"}, "action": {"replay"}, "reason": {"billing restored"}})
	waitJob(t, h, replayJob, outbox.JobDone)

	_, body := b.get(t, h.base+"/outbox/"+retried[0], "text/html")
	d := doc(t, body)
	var timeline []string
	d.Find(`[data-testid="timeline"] li`).Each(func(_ int, s *goquery.Selection) {
		timeline = append(timeline, strings.Join(strings.Fields(s.Text()), " "))
	})
	want := []string{"created", "dead (a bulk job", "retry by oncall via bulk job", // no attempts since: no attempts line
		"dead letter by oncall", "dead"}
	if len(timeline) != len(want) {
		t.Fatalf("timeline %q, want lines starting %q", timeline, want)
	}
	for i := range want {
		if !strings.HasPrefix(timeline[i], want[i]) {
			t.Errorf("timeline line %d %q, want it to start %q (all: %q)", i, timeline[i], want[i], timeline)
		}
	}
	if !strings.Contains(timeline[2], "…"+retryJob.String()[24:]+" ") {
		t.Errorf("the bulk retry's line %q does not name its job apart from the time", timeline[2])
	}
	if link := d.Find(`[data-testid="bulk-action"] a[data-testid="bulk-job"]`).AttrOr("href", ""); link != "/jobs/"+retryJob.String() {
		t.Errorf("the timeline's bulk retry links to %q, want its job", link)
	}
	if d.Find(`[data-testid="audit"]`).Length() != 0 {
		t.Error("an operator's event page shows the audit trail's panel")
	}
	admin, _ := h.signedIn(t, "admin")
	_, body = admin.get(t, h.base+"/outbox/"+retried[0], "text/html")
	rows := doc(t, body).Find(`[data-testid="audit-row"]`)
	if rows.Length() != 2 || !strings.Contains(rows.Eq(1).Text(), "outbox.retry") || !strings.Contains(rows.Eq(1).Text(), "via bulk job") ||
		!strings.Contains(rows.Eq(1).Text(), "broker fixed") || rows.Eq(1).Find(`a[data-testid="bulk-job"]`).AttrOr("href", "") != "/jobs/"+retryJob.String() {
		t.Errorf("audit rows: the newest should be the dead-letter, the other the job's retry with its reason and link: %s", outerHTML(rows))
	}

	// A replay restarts the attempts: the relay's publish after it is
	// counted after it on the timeline.
	if _, err := h.pool.Exec(ctx, `UPDATE outbox_event SET attempts = 1 WHERE id = $1`, replayed[1]); err != nil {
		t.Fatal(err)
	}
	_, body = b.get(t, h.base+"/outbox/"+replayed[1], "text/html")
	d = doc(t, body)
	if got := strings.Join(strings.Fields(d.Find(`[data-testid="bulk-action"]`).Text()), " "); !strings.HasPrefix(got, "replay by oncall via bulk job") {
		t.Errorf("replayed event's timeline says %q", got)
	}
	var lines []string
	d.Find(`[data-testid="timeline"] li`).Each(func(_ int, s *goquery.Selection) { lines = append(lines, strings.Join(strings.Fields(s.Text()), " ")) })
	if len(lines) < 3 || !strings.HasPrefix(lines[1], "replay by oncall") || lines[2] != "1 publish attempt since the last replay" {
		t.Errorf("replayed event's timeline %q, want the replay, then the attempt since it", lines)
	}
	_, body = admin.get(t, h.base+"/outbox/"+replayed[1], "text/html")
	if d := doc(t, body); d.Find(`[data-testid="audit-empty"]`).Length() != 0 || d.Find(`[data-testid="audit-row"]`).Length() != 1 {
		t.Errorf("a replayed event's audit panel: %s", d.Find(`[data-testid="audit"]`).Text())
	}

	_, body = admin.get(t, h.base+"/outbox/"+untouched, "text/html")
	if d := doc(t, body); d.Find(`[data-testid="audit-empty"]`).Length() != 1 || d.Find(`[data-testid="bulk-action"]`).Length() != 0 {
		t.Errorf("an event no job touched: %s", body)
	}

	_, body = b.get(t, h.base+"/trace/event/"+retried[1], "text/html")
	if !strings.Contains(body, "outbox.retry by oncall via bulk job "+retryJob.String()[:8]) || !strings.Contains(body, `href="/jobs/`+retryJob.String()+`"`) {
		t.Errorf("the operator's trace does not show the job's retry with its link: %s", body)
	}
	// A viewer's trace names the job without a link to a page it may not open.
	viewer, _ := h.signedIn(t, "support")
	_, body = viewer.get(t, h.base+"/trace/event/"+retried[1], "text/html")
	if !strings.Contains(body, "via bulk job "+retryJob.String()[:8]) || strings.Contains(body, `href="/jobs/`) {
		t.Errorf("the viewer's trace: the job's retry missing, or linked to /jobs: %s", body)
	}

	// An auditor cannot open jobs: the job is named, not linked.
	a, _ := h.signedIn(t, "auditor")
	_, body = a.get(t, h.base+"/outbox/"+retried[1], "text/html")
	d = doc(t, body)
	if job := d.Find(`[data-testid="bulk-action"] [data-testid="bulk-job"]`); job.Length() != 1 || goquery.NodeName(job) != "code" ||
		job.AttrOr("title", "") != retryJob.String() {
		t.Errorf("the auditor's page names the job as %s", outerHTML(job))
	}
}

func outerHTML(s *goquery.Selection) string {
	h, _ := goquery.OuterHtml(s)
	return h
}

// seedMoreDead adds n dead events on topic, of aggregates of their own.
func seedMoreDead(t *testing.T, h *harness, topic string, n int) {
	t.Helper()
	outboxtest.Insert(t, h.pool, outboxtest.Seed{N: n, Topic: topic, AggregateType: "job", AggregateID: topic + "-more-{n}",
		EventType: "job.v1", Status: "dead", Attempts: 10, Age: time.Hour})
}

// A dry run counts up to the cap: past it, it says "more than 10,000", and
// confirming it covers any number past the cap, as the operator was shown
// (the job still walks every event). With a threshold above the cap, a
// count that stopped at the cap needs a recent sign-in: how many there are
// is not known. An exact dry run that the filter outgrows past the cap is a
// conflict that says "more than 10,000".
func TestBulkDryRunPastTheCapConfirmsWhatItShowed(t *testing.T) {
	t.Parallel()
	h := start(t, options{configure: func(c *web.Config) { c.BulkRecentLoginAbove = 50_000; c.RecentLogin = time.Minute }})
	seedDeadEvents(t, h, "capped", outbox.JobCountExactBelow+50)
	seedDeadEvents(t, h, "exact", outbox.JobCountExactBelow-5)
	b, token := h.signedIn(t, "oncall")
	if _, err := h.pool.Exec(context.Background(), `UPDATE console_session SET auth_time = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	dry := url.Values{"dry_run": {"1"}, "topic": {"capped"}, "action": {"retry"}}
	_, body := b.postForm(t, h.base+"/outbox/bulk", token, dry)
	d := doc(t, body)
	if got := d.Find(`[data-testid="bulk-count"]`).Text(); !strings.HasPrefix(got, "more than 10,000") {
		t.Fatalf("dry run count %q, want more than 10,000", got)
	}
	link := d.Find(`[data-testid="bulk-reauth-link"]`).AttrOr("href", "")
	if link == "" || !strings.Contains(d.Find(`[data-testid="bulk-reauth"]`).Text(), "perhaps more than 50,000") {
		t.Fatalf("a count past the cap with an old sign-in: no re-authentication: %s", body)
	}
	resp, data := h.signInAt(t, b, h.base+link, "oncall", "oncall")
	if resp.Request.URL.Path != "/outbox/bulk" {
		t.Fatalf("re-authentication landed on %s", resp.Request.URL)
	}
	token = csrfField.FindStringSubmatch(data)[1]

	// Confirmed as "more than 10,000"; more events die before the
	// confirmation arrives: still what the operator confirmed.
	_, body = b.postForm(t, h.base+"/outbox/bulk", token, dry)
	confirm := url.Values{}
	doc(t, body).Find(`[data-testid="bulk-confirm-form"] input[type="hidden"]`).Each(func(_ int, s *goquery.Selection) {
		confirm.Set(s.AttrOr("name", ""), s.AttrOr("value", ""))
	})
	if confirm.Get("expect") != fmt.Sprint(outbox.JobCountExactBelow+1) {
		t.Fatalf("the confirmation expects %q, want %d (more than the cap)", confirm.Get("expect"), outbox.JobCountExactBelow+1)
	}
	seedMoreDead(t, h, "capped", 100)
	id := h.confirmOnly(t, b, token, confirm)
	j := waitJob(t, h, id, outbox.JobDone)
	if want := int64(outbox.JobCountExactBelow + 150); j.MatchedMoreThan != outbox.JobCountExactBelow || j.Done != want {
		t.Fatalf("job %+v: want more than %d matched and %d retried", j, outbox.JobCountExactBelow, want)
	}

	// An exact dry run the filter outgrows past the cap.
	_, body = b.postForm(t, h.base+"/outbox/bulk", token, url.Values{"dry_run": {"1"}, "topic": {"exact"}, "action": {"retry"}})
	if got := doc(t, body).Find(`[data-testid="bulk-count"]`).Text(); got != "9,995" {
		t.Fatalf("dry run count %q, want 9,995", got)
	}
	seedMoreDead(t, h, "exact", 10)
	// (A confirmation naming a dry run after the new events: one made
	// before them would act on the 9,995 it showed.)
	resp, body = b.postForm(t, h.base+"/outbox/bulk", token, url.Values{"topic": {"exact"}, "action": {"retry"}, "expect": {"9995"},
		"seen_at": {time.Now().UTC().Format(time.RFC3339Nano)}})
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "now matches more than 10,000") {
		t.Fatalf("confirm after the count passed the cap: %d %s", resp.StatusCode, body)
	}
}
