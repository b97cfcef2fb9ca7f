package web_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/testkit"
)

type topicAudit struct {
	actor, reason, outcome, code, before, after string
}

func (h *harness) topicAudit(t *testing.T, action, topic string) []topicAudit {
	t.Helper()
	rows, err := h.pool.Query(context.Background(), `
		SELECT actor_name, reason, outcome, coalesce(error_code, ''), coalesce(before::text, ''), coalesce(after::text, '')
		  FROM audit_event WHERE action = $1 AND target_type = 'outbox_topic' AND target_id = $2 ORDER BY seq`, action, topic)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []topicAudit
	for rows.Next() {
		var r topicAudit
		if err := rows.Scan(&r.actor, &r.reason, &r.outcome, &r.code, &r.before, &r.after); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// An operator pauses a topic from its outbox list with a reason; the list
// and the dashboard show who paused it, when and why; pausing it again is
// a conflict; resume ends it. Every attempt is audited.
func TestPauseAndResumeATopicFromTheConsole(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	plant(t, h, planted{status: "pending", topic: "orders.v1"})
	b, token := h.signedIn(t, "oncall")

	// The list of one topic offers the pause form to an operator.
	_, page := b.get(t, h.base+"/outbox?topic=orders.v1", "text/html")
	if doc(t, page).Find(`[data-testid="form-topic-pause"]`).Length() != 1 {
		t.Fatalf("no pause form on the topic's list:\n%s", page)
	}
	// No reason: refused, nothing paused, audited as invalid.
	resp, body := h.postForm(t, b, "/outbox/topics/orders.v1/pause", url.Values{"csrf_token": {token}, "reason": {"  "}})
	if resp.StatusCode != http.StatusUnprocessableEntity || doc(t, body).Find(`[data-testid="topic-reason-error"]`).Length() != 1 {
		t.Fatalf("pause without reason: %d\n%s", resp.StatusCode, body)
	}
	if n := h.countAudit(t, `action = 'outbox.topic.pause' AND outcome = 'error' AND error_code = 'invalid'`); n != 1 {
		t.Fatalf("%d invalid pause audit rows, want 1", n)
	}
	if h.paused(t, "orders.v1") {
		t.Fatal("a pause without reason paused the topic")
	}

	resp, body = h.postForm(t, b, "/outbox/topics/orders.v1/pause", url.Values{"csrf_token": {token}, "reason": {"consumer <b>migration</b>"}})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/outbox?topic=orders.v1" {
		t.Fatalf("pause: %d %s %s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	if !h.paused(t, "orders.v1") {
		t.Fatal("the topic is not paused")
	}
	rows := h.topicAudit(t, "outbox.topic.pause", "orders.v1")
	last := rows[len(rows)-1]
	if last.outcome != audit.OutcomeOK || last.actor != "oncall" || last.reason != "consumer <b>migration</b>" || !strings.Contains(last.after, `"paused_by": "oncall"`) {
		t.Fatalf("pause audit row %+v", last)
	}
	_, page = b.get(t, h.base+"/outbox?topic=orders.v1", "text/html")
	d := doc(t, page)
	if d.Find(`[data-testid="paused-topic"]`).Length() != 1 || !strings.Contains(d.Find(`[data-testid="paused-by"]`).Text(), "paused by oncall") ||
		d.Find(`[data-testid="paused-reason"]`).Text() != "consumer <b>migration</b>" || d.Find(`[data-testid="form-topic-resume"]`).Length() != 1 ||
		d.Find(`[data-testid="form-topic-pause"]`).Length() != 0 {
		t.Fatalf("the list does not show the pause:\n%s", page)
	}
	if strings.Contains(page, "<b>migration") {
		t.Fatal("the reason is rendered as markup")
	}
	// The dashboard's topics panel shows it too, "Paused" once.
	testkit.Until(t, "the dashboard shows the pause", func() bool {
		_, page := b.get(t, h.base+"/", "text/html")
		return strings.HasPrefix(doc(t, page).Find(`[data-testid="topic-paused"]`).Text(), "Paused by oncall at ")
	})

	// Pausing a paused topic is a conflict that changes nothing.
	resp, body = h.postForm(t, b, "/outbox/topics/orders.v1/pause", url.Values{"csrf_token": {token}, "reason": {"again"}})
	if resp.StatusCode != http.StatusConflict || !strings.Contains(doc(t, body).Find(`[data-testid="topic-problem"]`).Text(), "already paused by oncall") {
		t.Fatalf("second pause: %d\n%s", resp.StatusCode, body)
	}
	if n := h.countAudit(t, `action = 'outbox.topic.pause' AND error_code = 'conflict'`); n != 1 {
		t.Fatalf("%d conflict audit rows, want 1", n)
	}

	resp, _ = h.postForm(t, b, "/outbox/topics/orders.v1/resume", url.Values{"csrf_token": {token}, "reason": {"migration done"}})
	if resp.StatusCode != http.StatusSeeOther || h.paused(t, "orders.v1") {
		t.Fatalf("resume: %d, paused %v", resp.StatusCode, h.paused(t, "orders.v1"))
	}
	rows = h.topicAudit(t, "outbox.topic.resume", "orders.v1")
	if len(rows) != 1 || rows[0].outcome != audit.OutcomeOK || rows[0].reason != "migration done" || !strings.Contains(rows[0].before, "consumer <b>migration</b>") {
		t.Fatalf("resume audit rows %+v", rows)
	}
	// Resuming a running topic is a conflict too.
	resp, _ = h.postForm(t, b, "/outbox/topics/orders.v1/resume", url.Values{"csrf_token": {token}, "reason": {"again"}})
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("second resume: %d", resp.StatusCode)
	}
}

// A viewer sees a pause but no button, and is refused (403, audited) when
// posting anyway; a post without CSRF token is refused for anyone.
func TestPauseIsRefusedWithoutPermissionOrCSRF(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	support, stoken := h.signedIn(t, "support")
	oncall, _ := h.signedIn(t, "oncall")
	if _, err := h.pool.Exec(context.Background(),
		`INSERT INTO outbox_topic_pause (topic, paused_by, reason) VALUES ('billing', 'someone', 'maintenance')`); err != nil {
		t.Fatal(err)
	}
	_, page := support.get(t, h.base+"/outbox?topic=billing", "text/html")
	d := doc(t, page)
	if d.Find(`[data-testid="paused-topic"]`).Length() != 1 || d.Find(`form[data-testid^="form-topic-"]`).Length() != 0 {
		t.Fatalf("support: the pause without buttons expected:\n%s", page)
	}
	resp, _ := h.postForm(t, support, "/outbox/topics/billing/resume", url.Values{"csrf_token": {stoken}, "reason": {"x"}})
	if resp.StatusCode != http.StatusForbidden || !h.paused(t, "billing") {
		t.Fatalf("support's resume: %d", resp.StatusCode)
	}
	if n := h.countAudit(t, `action = 'request.denied' AND actor_name = 'support'`); n < 1 {
		t.Fatalf("support's refused resume not audited")
	}
	resp, _ = h.postForm(t, oncall, "/outbox/topics/billing/resume", url.Values{"reason": {"x"}})
	if resp.StatusCode != http.StatusForbidden || !h.paused(t, "billing") {
		t.Fatalf("resume without CSRF: %d", resp.StatusCode)
	}
	resp, _ = h.postForm(t, oncall, "/outbox/topics/other/pause", url.Values{"reason": {"x"}})
	if resp.StatusCode != http.StatusForbidden || h.paused(t, "other") {
		t.Fatalf("pause without CSRF: %d", resp.StatusCode)
	}
}

func (h *harness) paused(t *testing.T, topic string) bool {
	t.Helper()
	var n int
	if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_topic_pause WHERE topic = $1`, topic).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}
