package web_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/PuerkitoBio/goquery"
	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/web"
)

type auditRow struct {
	actorName, actorIss, reason, requestID, outcome, errorCode string
	roles                                                      []string
	before, after                                              map[string]any
}

func (h *harness) auditRows(t *testing.T, action string, id uuid.UUID) []auditRow {
	t.Helper()
	rows, err := h.pool.Query(context.Background(), `
		SELECT actor_name, actor_iss, actor_roles, reason, request_id, outcome, error_code, coalesce(before, 'null'), coalesce(after, 'null')
		  FROM audit_event WHERE action = $1 AND target_type = 'outbox_event' AND target_id = $2 ORDER BY seq`, action, id.String())
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []auditRow
	for rows.Next() {
		var (
			r             auditRow
			before, after []byte
		)
		if err := rows.Scan(&r.actorName, &r.actorIss, &r.roles, &r.reason, &r.requestID, &r.outcome, &r.errorCode, &before, &after); err != nil {
			t.Fatal(err)
		}
		_ = json.Unmarshal(before, &r.before)
		_ = json.Unmarshal(after, &r.after)
		out = append(out, r)
	}
	return out
}

// Invariant 11 for every single action: a commit leaves the effect and its
// ok audit row; a transaction that fails after the action (the audit
// insert refused by a planted trigger) leaves neither, and the failed
// attempt is audited on its own.
func TestOutboxActionAndAuditCommitTogetherOrNotAtAll(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b, token := h.signedIn(t, "oncall")
	ctx := context.Background()
	cases := []struct {
		path, action, from, to, reason string
	}{
		{"retry", "outbox.retry", "dead", "pending", ""},
		{"retry-now", "outbox.retry_now", "pending", "pending", ""},
		{"dead-letter", "outbox.dead_letter", "pending", "dead", "broker keeps refusing the schema"},
		{"discard", "outbox.discard", "dead", "discarded", "superseded by a correction event"},
	}
	for _, c := range cases {
		id := plant(t, h, planted{status: c.from, attempts: 3, lastError: "boom"})
		resp, body := h.postForm(t, b, "/outbox/"+id.String()+"/"+c.path,
			url.Values{"csrf_token": {token}, "expected": {c.from}, "reason": {c.reason}})
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/outbox/"+id.String()+"?done="+c.path {
			t.Fatalf("%s: %d %s %s", c.path, resp.StatusCode, resp.Header.Get("Location"), body)
		}
		if got := h.status(t, id); got != c.to {
			t.Errorf("%s: status %s, want %s", c.path, got, c.to)
		}
		rows := h.auditRows(t, c.action, id)
		if len(rows) != 1 {
			t.Fatalf("%s: %d audit rows, want 1", c.path, len(rows))
		}
		r := rows[0]
		if r.outcome != audit.OutcomeOK || r.actorName != "oncall" || r.actorIss != h.idp.Issuer() || strings.Join(r.roles, ",") != "operator" ||
			r.reason != c.reason || r.requestID == "" || r.before["status"] != c.from || r.after["status"] != c.to {
			t.Errorf("%s: audit row %+v", c.path, r)
		}
		for _, leak := range []string{"payload", "headers", "last_error"} {
			if _, ok := r.before[leak]; ok {
				t.Errorf("%s: the audit row carries %s", c.path, leak)
			}
		}
		// The notice after the redirect.
		_, page := b.get(t, h.base+resp.Header.Get("Location"), "text/html")
		if doc(t, page).Find(`[data-testid="notice"]`).Length() != 1 {
			t.Errorf("%s: no notice after the redirect", c.path)
		}
	}

	// The audit insert fails after the action ran in the same transaction.
	if _, err := h.pool.Exec(ctx, `
		CREATE FUNCTION test_refuse_ok_audit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'planted failure'; END $$;
		CREATE TRIGGER test_refuse_ok_audit BEFORE INSERT ON audit_event
		    FOR EACH ROW WHEN (NEW.outcome = 'ok' AND NEW.action LIKE 'outbox.%') EXECUTE FUNCTION test_refuse_ok_audit();`); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		id := plant(t, h, planted{status: c.from, attempts: 3})
		var before string
		if err := h.pool.QueryRow(ctx, `SELECT row_to_json(e)::text FROM outbox_event e WHERE id = $1`, id).Scan(&before); err != nil {
			t.Fatal(err)
		}
		resp, _ := h.postForm(t, b, "/outbox/"+id.String()+"/"+c.path,
			url.Values{"csrf_token": {token}, "expected": {c.from}, "reason": {c.reason}})
		if resp.StatusCode != http.StatusInternalServerError {
			t.Errorf("%s with a failing audit: %d, want 500", c.path, resp.StatusCode)
		}
		var after string
		if err := h.pool.QueryRow(ctx, `SELECT row_to_json(e)::text FROM outbox_event e WHERE id = $1`, id).Scan(&after); err != nil {
			t.Fatal(err)
		}
		if after != before {
			t.Errorf("%s: the event changed although its audit failed:\n%s\n%s", c.path, before, after)
		}
		rows := h.auditRows(t, c.action, id)
		if len(rows) != 1 || rows[0].outcome != audit.OutcomeError || rows[0].errorCode != "error" {
			t.Errorf("%s: audit rows %+v, want only the failed attempt", c.path, rows)
		}
	}

	_, metrics := b.get(t, h.base+"/metrics", "")
	for _, want := range []string{
		`sluice_console_actions_total{action="outbox.retry",outcome="ok"} 1`,
		`sluice_console_actions_total{action="outbox.discard",outcome="error"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// Fifty operators retry one dead event at once: one wins, forty-nine are
// told someone acted first; every attempt is audited and the chain holds.
func TestFiftyConcurrentRetriesOneWins(t *testing.T) {
	t.Parallel()
	h := start(t, options{configure: func(c *web.Config) { c.LoginRate = 10_000 }})
	id := plant(t, h, planted{status: "dead", attempts: 10, lastError: "refused"})
	const n = 50
	type op struct {
		b     *browser
		token string
	}
	ops := make([]op, n)
	for i := range ops {
		b := newBrowser(t)
		user := "oncall"
		if i%5 == 0 {
			user = "admin"
		}
		h.login(t, b, user, user, "")
		ops[i] = op{b, h.csrf(t, b)}
	}
	codes := make([]int, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range ops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, _ := h.postForm(t, ops[i].b, "/outbox/"+id.String()+"/retry", url.Values{"csrf_token": {ops[i].token}, "expected": {"dead"}})
			codes[i] = resp.StatusCode
		}()
	}
	close(start)
	wg.Wait()
	count := map[int]int{}
	for _, c := range codes {
		count[c]++
	}
	if count[http.StatusSeeOther] != 1 || count[http.StatusConflict] != n-1 {
		t.Fatalf("status codes %v, want one 303 and %d 409", count, n-1)
	}
	rows := h.auditRows(t, "outbox.retry", id)
	outcomes := map[string]int{}
	for _, r := range rows {
		outcomes[r.outcome+"/"+r.errorCode]++
	}
	if outcomes["ok/"] != 1 || outcomes["error/conflict"] != n-1 || len(rows) != n {
		t.Fatalf("audit outcomes %v, want 1 ok and %d conflicts", outcomes, n-1)
	}
	res, err := audit.Verify(context.Background(), h.pool)
	if err != nil || !res.Intact() {
		t.Fatalf("audit chain: %+v %v", res, err)
	}
	if h.status(t, id) != "pending" {
		t.Fatalf("status %s", h.status(t, id))
	}
}

// A stale page: the operator saw the event pending, a relay has published
// it since. 409 with the event as it is now; nothing changed.
func TestStaleActionIsAConflictShowingTheCurrentState(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b, token := h.signedIn(t, "oncall")
	id := plant(t, h, planted{status: "pending"})
	_, page := b.get(t, h.base+"/outbox/"+id.String(), "text/html")
	expected := doc(t, page).Find(`[data-testid="form-dead-letter"] input[name="expected"]`).AttrOr("value", "")
	if expected != "pending" {
		t.Fatalf("the page's dead-letter form carries expected=%q", expected)
	}
	if _, err := h.pool.Exec(context.Background(), `UPDATE outbox_event SET status = 'published', published_at = now() WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if _, _, err := outbox.RecountBacklog(context.Background(), h.pool); err != nil { // a status changed by hand
		t.Fatal(err)
	}
	resp, body := h.postForm(t, b, "/outbox/"+id.String()+"/dead-letter",
		url.Values{"csrf_token": {token}, "expected": {expected}, "reason": {"stuck"}})
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("stale dead-letter: %d", resp.StatusCode)
	}
	d := doc(t, body)
	if msg := d.Find(`[data-testid="conflict"]`).Text(); !strings.Contains(msg, "it is now published") {
		t.Errorf("conflict message %q", msg)
	}
	if got := d.Find(`[data-testid="event-status"]`).Text(); got != "published" {
		t.Errorf("the page shows %q, want the current state published", got)
	}
	if d.Find(`[data-testid="published-at"]`).Length() != 1 {
		t.Error("the current timeline is missing")
	}
	// The page's live notice concerns the event it shows, never the
	// outbox's figures, which the page does not show.
	if ws := d.Find(`[ws-connect]`).AttrOr("ws-connect", ""); !strings.Contains(ws, "page=record") || !strings.Contains(ws, "id="+id.String()) || strings.Contains(ws, "watch=outbox") {
		t.Errorf("the page's socket %q does not watch the event alone", ws)
	}
	var deadReason *string
	if err := h.pool.QueryRow(context.Background(), `SELECT dead_reason FROM outbox_event WHERE id = $1`, id).Scan(&deadReason); err != nil || deadReason != nil {
		t.Fatalf("something changed: dead_reason %v (%v)", deadReason, err)
	}
	rows := h.auditRows(t, "outbox.dead_letter", id)
	if len(rows) != 1 || rows[0].outcome != audit.OutcomeError || rows[0].errorCode != "conflict" || rows[0].before["status"] != "published" || rows[0].reason != "stuck" {
		t.Fatalf("audit rows %+v", rows)
	}
}

// A reason is required to dead-letter or discard: the field says so (422),
// nothing is attempted.
func TestActionWithoutReasonIsAFieldError(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b, token := h.signedIn(t, "oncall")
	for _, c := range []struct{ path, status string }{{"dead-letter", "pending"}, {"discard", "dead"}} {
		id := plant(t, h, planted{status: c.status})
		resp, body := h.postForm(t, b, "/outbox/"+id.String()+"/"+c.path, url.Values{"csrf_token": {token}, "expected": {c.status}, "reason": {"   "}})
		if resp.StatusCode != http.StatusUnprocessableEntity {
			t.Fatalf("%s without reason: %d", c.path, resp.StatusCode)
		}
		d := doc(t, body)
		if d.Find(`[data-testid="form-`+c.path+`"] [data-testid="reason-error"]`).Length() != 1 ||
			d.Find(`[data-testid="reason-`+c.path+`"][aria-invalid="true"]`).Length() != 1 {
			t.Errorf("%s: no field error beside the reason", c.path)
		}
		if h.status(t, id) != c.status {
			t.Errorf("%s: the event changed", c.path)
		}
	}
	// An id that is no UUID is refused before any query; an unknown one is 404.
	resp, _ := h.postForm(t, b, "/outbox/not-a-uuid/retry", url.Values{"csrf_token": {token}, "expected": {"dead"}})
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("bad id: %d", resp.StatusCode)
	}
	resp, _ = h.postForm(t, b, "/outbox/"+uuid.New().String()+"/retry", url.Values{"csrf_token": {token}, "expected": {"dead"}})
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown id: %d", resp.StatusCode)
	}
}

// Support sees no action buttons, and the server refuses (403, audited)
// when support posts one anyway.
func TestViewerSeesNoActionsAndIsRefused(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	dead := plant(t, h, planted{status: "dead"})
	pending := plant(t, h, planted{status: "pending"})
	support, oncall := newBrowser(t), newBrowser(t)
	h.login(t, support, "support", "support", "")
	h.login(t, oncall, "oncall", "oncall", "")
	for _, id := range []uuid.UUID{dead, pending} {
		_, page := support.get(t, h.base+"/outbox/"+id.String(), "text/html")
		d := doc(t, page)
		if n := d.Find(`[data-testid="actions"], form[action^="/outbox/"], [data-testid^="action-"]`).Length(); n != 0 {
			t.Errorf("support sees %d action elements on a %s event", n, h.status(t, id))
		}
		_, page = oncall.get(t, h.base+"/outbox/"+id.String(), "text/html")
		if doc(t, page).Find(`[data-testid="actions"] form`).Length() != 2 {
			t.Errorf("oncall does not see the two actions of a %s event", h.status(t, id))
		}
	}
	_, list := support.get(t, h.base+"/outbox", "text/html")
	if n := doc(t, list).Find(`[data-testid="row-retry"]`).Length(); n != 0 {
		t.Errorf("support sees %d retry buttons on the list", n)
	}
	_, list = oncall.get(t, h.base+"/outbox", "text/html")
	if n := doc(t, list).Find(`[data-testid="row-retry"]`).Length(); n != 1 {
		t.Errorf("oncall sees %d retry buttons on the list, want 1 (the dead event)", n)
	}
	token := h.csrf(t, support)
	resp, _ := h.postForm(t, support, "/outbox/"+dead.String()+"/retry", url.Values{"csrf_token": {token}, "expected": {"dead"}})
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("support's retry: %d", resp.StatusCode)
	}
	if h.status(t, dead) != "dead" {
		t.Fatal("support's retry changed the event")
	}
	if n := h.countAudit(t, `action = 'request.denied' AND outcome = 'denied' AND error_code = 'permission' AND target_id = 'POST /outbox/:id/retry' AND actor_name = 'support'`); n != 1 {
		t.Fatalf("support's retry audited %d times", n)
	}
}

// An htmx request gets the updated event fragment instead of a redirect.
func TestHtmxActionAnswersWithTheFragment(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b, token := h.signedIn(t, "admin")
	id := plant(t, h, planted{status: "dead"})
	req, _ := http.NewRequest(http.MethodPost, h.base+"/outbox/"+id.String()+"/retry", strings.NewReader(url.Values{"expected": {"dead"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("HX-Request", "true")
	req.Header.Set("X-CSRF-Token", token)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := b.noRedirects().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	d, err := goquery.NewDocumentFromReader(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || d.Find("html > head > title").Length() != 0 ||
		d.Find(`#event [data-testid="notice"]`).Length() != 1 || d.Find(`[data-testid="event-status"]`).Text() != "pending" {
		t.Fatalf("htmx retry: %d, fragment %q", resp.StatusCode, d.Find("#event").Text())
	}
}
