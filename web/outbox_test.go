package web_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/outbox/outboxtest"
	"github.com/sluice-dev/sluice/internal/testkit"
)

func rowIDs(d *goquery.Document) []string {
	var ids []string
	d.Find(`[data-testid="row-id"]`).Each(func(_ int, s *goquery.Selection) { ids = append(ids, s.Text()) })
	return ids
}

func TestOutboxListFiltersPagesAndRefusals(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	ctx := context.Background()
	dead := plant(t, h, planted{topic: "payments", etype: "payment.requested.v1", status: "dead", attempts: 10, lastError: "broker refused: schema v3 unknown"})
	other := plant(t, h, planted{topic: "payments", status: "pending", lastError: "timeout"})
	plant(t, h, planted{topic: "ledger", status: "published"})
	// A large history, so the count is an estimate and the list has pages.
	outboxtest.Insert(t, h.pool, outboxtest.Seed{N: 10100, Topic: "bulk", AggregateType: "bulk", EventType: "bulk.v1", Status: "published"})
	if _, err := h.pool.Exec(ctx, `ANALYZE outbox_event`); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	get := func(q string) (int, *goquery.Document) {
		t.Helper()
		resp, body := b.get(t, h.base+"/outbox"+q, "text/html")
		return resp.StatusCode, doc(t, body)
	}

	code, d := get("?status=dead")
	if code != 200 || strings.Join(rowIDs(d), ",") != dead.String() {
		t.Fatalf("status=dead: %d %v", code, rowIDs(d))
	}
	if got := d.Find(`[data-testid="row-error"]`).Text(); got != "broker refused: schema v3 unknown" {
		t.Errorf("row error %q", got)
	}
	if got := d.Find(`[data-testid="count"]`).Text(); !strings.Contains(got, "1") || !strings.Contains(got, "status dead") {
		t.Errorf("count line %q", got)
	}
	if d.Find(`select[name="status"] option[selected]`).AttrOr("value", "") != "dead" {
		t.Error("the form does not keep the filter")
	}
	for q, want := range map[string]string{
		"?topic=payments&status=pending":                      other.String(),
		"?id_prefix=" + dead.String()[:23]:                    dead.String(),
		"?error_text=SCHEMA+V3&status=dead":                   dead.String(),
		"?aggregate_type=order&aggregate_id=" + dead.String(): dead.String(),
		"?event_type=payment.requested.v1":                    dead.String(),
		"?topic=payments&sort=oldest":                         dead.String() + "," + other.String(),
		"?topic=payments&created_from=" + time.Now().UTC().Add(-time.Hour).Format("2006-01-02T15:04"): other.String() + "," + dead.String(),
	} {
		if code, d := get(q); code != 200 || strings.Join(rowIDs(d), ",") != want {
			t.Errorf("%s: %d %v, want %s", q, code, rowIDs(d), want)
		}
	}

	// The empty state names the filter.
	code, d = get("?topic=nothing-here&status=dead")
	if code != 200 || !strings.Contains(d.Find(`[data-testid="empty"]`).Text(), `topic "nothing-here"`) ||
		!strings.Contains(d.Find(`[data-testid="empty"]`).Text(), "status dead") {
		t.Errorf("empty state: %d %q", code, d.Find(`[data-testid="empty"]`).Text())
	}

	// Pages: keyset, the cursor in the URL, the estimate beyond the exact bound.
	code, d = get("?topic=bulk")
	if code != 200 || len(rowIDs(d)) != 50 || !strings.Contains(d.Find(`[data-testid="count"]`).Text(), "≈") {
		t.Fatalf("page 1: %d, %d rows, count %q", code, len(rowIDs(d)), d.Find(`[data-testid="count"]`).Text())
	}
	next := d.Find(`[data-testid="next"]`).AttrOr("href", "")
	u, err := url.Parse(next)
	if err != nil || u.Query().Get("after") == "" || u.Query().Get("topic") != "bulk" {
		t.Fatalf("next link %q", next)
	}
	_, body := b.get(t, h.base+next, "text/html")
	page2 := rowIDs(doc(t, body))
	seen := map[string]bool{}
	for _, id := range rowIDs(d) {
		seen[id] = true
	}
	for _, id := range page2 {
		if seen[id] {
			t.Fatalf("page 2 repeats %s", id)
		}
	}
	if len(page2) != 50 || doc(t, body).Find(`[data-testid="first"]`).Length() != 1 {
		t.Fatalf("page 2: %d rows", len(page2))
	}
	// A shared URL reproduces the page for someone else.
	other2 := newBrowser(t)
	h.login(t, other2, "auditor", "auditor", "")
	_, body2 := other2.get(t, h.base+next, "text/html")
	if strings.Join(rowIDs(doc(t, body2)), ",") != strings.Join(page2, ",") {
		t.Fatal("the shared URL shows another page")
	}

	// Refusals: a clear 400 that says what is wrong.
	for q, want := range map[string]string{
		"?after=garbage": "page link",
		"?topic=bulk&after=" + u.Query().Get("after") + "&sort=oldest": "page link",
		"?topic=ledger&after=" + u.Query().Get("after"):                "page link",
		"?status=bogus":           "is not one of pending",
		"?aggregate_id=x":         "aggregate id needs its aggregate type",
		"?error_text=x":           "error text",
		"?created_from=yesterday": "not a time",
		"?id_prefix=xyz":          "not hex",
	} {
		code, d := get(q)
		if code != http.StatusBadRequest || !strings.Contains(d.Find(`[data-testid="problem"]`).Text(), want) {
			t.Errorf("%s: %d %q, want 400 saying %q", q, code, d.Find(`[data-testid="problem"]`).Text(), want)
		}
		if d.Find(`[data-testid="filters"]`).Length() != 1 {
			t.Errorf("%s: the 400 page has no filter form to correct", q)
		}
	}
}

func TestEventDetailShowsTheWholeEvent(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	longErr := strings.Repeat("the broker said no; ", 30) + "END"
	agg := "inv-42"
	first := plant(t, h, planted{aggID: agg, seq: 1, status: "published"})
	dead := plant(t, h, planted{aggID: agg, seq: 2, status: "dead", attempts: 10, lastError: longErr,
		payload: `{"amount":"12.50","items":[1,2]}`, headers: `{"trace":"abc"}`})
	held := plant(t, h, planted{aggID: agg, seq: 3})
	plant(t, h, planted{aggID: agg, seq: 4})
	b := newBrowser(t)
	h.login(t, b, "oncall", "oncall", "")
	resp, body := b.get(t, h.base+"/outbox/"+dead.String(), "text/html")
	if resp.StatusCode != 200 {
		t.Fatalf("detail: %d", resp.StatusCode)
	}
	d := doc(t, body)
	checks := map[string]string{
		"event-id":   dead.String(),
		"topic":      "orders",
		"event-type": "order.placed.v1",
		"attempts":   "10",
		"last-error": longErr,
		"holds":      "Holds 2 later events of its aggregate.",
		"prev":       first.String(),
		"next":       held.String(),
	}
	for id, want := range checks {
		if got := strings.TrimSpace(d.Find(`[data-testid="` + id + `"]`).Text()); got != want {
			t.Errorf("%s: %q, want %q", id, got, want)
		}
	}
	// Masked by the event type's schema (internal/pii): the declared-safe
	// amount in clear, the undeclared items redacted (default-deny).
	if got := d.Find(`[hx-disable] [data-testid="payload"]`).Text(); got != "{\n  \"amount\": \"12.50\",\n  \"items\": \"[redacted]\"\n}" {
		t.Errorf("payload %q (or not inside hx-disable)", got)
	}
	if got := d.Find(`[hx-disable] [data-testid="headers"]`).Text(); !strings.Contains(got, `"trace": "abc"`) {
		t.Errorf("headers %q", got)
	}
	if d.Find(`[data-testid="prev"]`).AttrOr("href", "") != "/outbox/"+first.String() {
		t.Error("previous event not linked")
	}
	// The held event names what holds it, linked.
	_, body = b.get(t, h.base+"/outbox/"+held.String(), "text/html")
	hd := doc(t, body)
	if hd.Find(`[data-testid="held-by"] a`).AttrOr("href", "") != "/outbox/"+dead.String() ||
		!strings.Contains(hd.Find(`[data-testid="held-by"]`).Text(), "Held behind a dead letter") ||
		hd.Find(`[data-testid="event-status"]`).Text() != "held" {
		t.Errorf("held event: %q", hd.Find(`[data-testid="held-by"]`).Text())
	}
	// Never retried, its attempts count from its creation.
	if got := d.Find(`[data-testid="attempts-line"]`).Text(); got != "10 publish attempts" {
		t.Errorf("timeline's attempts %q, want %q", got, "10 publish attempts")
	}
	// After a retry the audit trail on the page names it.
	token := h.csrf(t, b)
	if resp, _ := h.postForm(t, b, "/outbox/"+dead.String()+"/retry", url.Values{"csrf_token": {token}, "expected": {"dead"}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("retry: %d", resp.StatusCode)
	}
	_, body = b.get(t, h.base+"/outbox/"+dead.String(), "text/html")
	d = doc(t, body)
	if d.Find(`[data-testid="audit-row"]`).Length() != 1 || !strings.Contains(d.Find(`[data-testid="audit-row"]`).Text(), "outbox.retry") ||
		!strings.Contains(d.Find(`[data-testid="timeline"]`).Text(), "retry by oncall") {
		t.Errorf("audit on the page: %q / %q", d.Find(`[data-testid="audit"]`).Text(), d.Find(`[data-testid="timeline"]`).Text())
	}
	// A retry restarts the count: one failed attempt after it (a relay's,
	// played here) is counted from the retry, and follows it on the timeline.
	if _, err := h.pool.Exec(context.Background(), `UPDATE outbox_event SET attempts = 1 WHERE id = $1`, dead); err != nil {
		t.Fatal(err)
	}
	_, body = b.get(t, h.base+"/outbox/"+dead.String(), "text/html")
	tl := doc(t, body).Find(`[data-testid="timeline"]`).Text()
	if got := doc(t, body).Find(`[data-testid="attempts-line"]`).Text(); got != "1 publish attempt since the last retry" ||
		strings.Index(tl, "retry by oncall") > strings.Index(tl, got) {
		t.Errorf("timeline after a retry and one attempt: %q", tl)
	}
	for path, want := range map[string]int{"/outbox/nope": 400, "/outbox/" + uuid.New().String(): 404, "/outbox/" + strings.ReplaceAll(dead.String(), "-", ""): 400} {
		if resp, _ := b.get(t, h.base+path, "text/html"); resp.StatusCode != want {
			t.Errorf("%s: %d, want %d", path, resp.StatusCode, want)
		}
	}
}

// SECURITY.md case 6 on the outbox pages: attacker text in every field
// stays text.
func TestOutboxPagesRenderAttackerTextInert(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	const (
		script = `<script>alert(1)</script>`
		attr   = `" onmouseover="alert(2)" hx-get="/logout`
	)
	evil := script + attr
	payload := `{"note": "<script>alert(1)</script>", "x": "\" onmouseover=\"alert(2)\" hx-get=\"/logout"}`
	id := plant(t, h, planted{aggType: evil, aggID: evil, topic: evil, etype: evil, payload: payload, headers: payload,
		status: "dead", lastError: evil})
	b := newBrowser(t)
	h.login(t, b, "oncall", "oncall", "")
	pages := map[string]string{}
	_, pages["list"] = b.get(t, h.base+"/outbox?status=dead", "text/html")
	_, pages["detail"] = b.get(t, h.base+"/outbox/"+id.String(), "text/html")
	_, pages["filtered list"] = b.get(t, h.base+"/outbox?topic="+url.QueryEscape(evil), "text/html")
	_, pages["refused list"] = b.get(t, h.base+"/outbox?status="+url.QueryEscape(evil), "text/html")
	for name, html := range pages {
		assertInert(t, name, html)
		if !strings.Contains(doc(t, html).Text(), script) {
			t.Errorf("%s: the text is not shown as text", name)
		}
	}
	d := doc(t, pages["detail"])
	// The payload of a type without a schema shows its keys only; the
	// headers show the attacker text, as text.
	if !strings.Contains(d.Find(`[data-testid="headers"]`).Text(), "<script>alert(1)</script>") ||
		strings.Contains(d.Find(`[data-testid="payload"]`).Text(), "<script>") ||
		d.Find(`[data-testid="last-error"]`).Text() != evil || d.Find(`[data-testid="topic"]`).Text() != evil {
		t.Error("detail: the attacker text is not shown verbatim (or the payload of a type without a schema is not redacted)")
	}
}

// The live notice: an open outbox page hears that the outbox changed.
func TestOutboxPageHearsChangesOverItsSocket(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 100 * time.Millisecond})
	dead := plant(t, h, planted{status: "dead"})
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	_, body := b.get(t, h.base+"/outbox/"+dead.String(), "text/html")
	ws := doc(t, body).Find(`[ws-connect]`).AttrOr("ws-connect", "")
	if !strings.HasPrefix(ws, "/ws?") {
		t.Fatalf("ws-connect %q", ws)
	}
	conn, err := h.dialPath(t, b, ws)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Nothing changed yet: frames come (the dashboard's), no notice.
	testkit.Eventually(t, "a few frames without a notice", func() (bool, error) {
		frames, err := readFrames(conn, 2)
		return err == nil && !strings.Contains(frames, "outbox-changes"), err
	})
	if _, err := h.pool.Exec(context.Background(), `UPDATE outbox_event SET status = 'pending', dead_at = NULL WHERE id = $1`, dead); err != nil {
		t.Fatal(err)
	}
	if _, _, err := outbox.RecountBacklog(context.Background(), h.pool); err != nil { // a status changed by hand
		t.Fatal(err)
	}
	testkit.Eventually(t, "the notice", func() (bool, error) {
		frames, err := readFrames(conn, 1)
		if err != nil {
			return false, err
		}
		d := doc(t, frames)
		n := d.Find(`#outbox-changed[hx-swap-oob]`)
		// One sentence, punctuated where the words end.
		return n.Length() == 1 && strings.Contains(n.Text(), "loaded: dead letters 1 → 0") && !strings.Contains(n.Text(), " ,") &&
			!strings.Contains(n.Text(), " .") && n.Find(`[data-testid="reload"]`).Length() == 1, nil
	})
}
