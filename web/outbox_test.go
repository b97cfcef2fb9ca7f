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
	// The count and the filter are words apart (templ drops the space
	// after a component: it read "1 eventmatch status dead").
	if got := squashed(d.Find(`[data-testid="count"]`)); got != "1 event matches status dead" {
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
		payload: `{"amount":"12.50","items":[1,2]}`, headers: `{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","customer_email":"jane@example.org"}`})
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
	// Headers are free-form: the trace context shows, any other value is
	// redacted (a producer may put personal data there).
	if got := d.Find(`[hx-disable] [data-testid="headers"]`).Text(); !strings.Contains(got, `"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"`) ||
		!strings.Contains(got, `"customer_email": "[redacted]"`) || strings.Contains(got, "jane@") {
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
	// The operator's timeline names the retry; the audit trail's panel is
	// the auditor's and the admin's, where the row is.
	if !strings.Contains(d.Find(`[data-testid="timeline"]`).Text(), "retry by oncall") || d.Find(`[data-testid="audit"]`).Length() != 0 {
		t.Errorf("timeline %q, audit panel %d (want none for an operator)", d.Find(`[data-testid="timeline"]`).Text(), d.Find(`[data-testid="audit"]`).Length())
	}
	auditor, _ := h.signedIn(t, "auditor")
	_, abody := auditor.get(t, h.base+"/outbox/"+dead.String(), "text/html")
	if ad := doc(t, abody); ad.Find(`[data-testid="audit-row"]`).Length() != 1 || !strings.Contains(ad.Find(`[data-testid="audit-row"]`).Text(), "outbox.retry") {
		t.Errorf("the auditor's audit panel: %q", ad.Find(`[data-testid="audit"]`).Text())
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
	headers := `{"traceparent": "<script>alert(1)</script>\" onmouseover=\"alert(2)\" hx-get=\"/logout", "<script>alert(1)</script>": "x"}`
	id := plant(t, h, planted{aggType: evil, aggID: evil, topic: evil, etype: evil, payload: payload, headers: headers,
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
	// headers show the attacker text (a shown header's value, a name), as
	// text.
	if !strings.Contains(d.Find(`[data-testid="headers"]`).Text(), "<script>alert(1)</script>") ||
		strings.Contains(d.Find(`[data-testid="payload"]`).Text(), "<script>") ||
		d.Find(`[data-testid="last-error"]`).Text() != evil || d.Find(`[data-testid="topic"]`).Text() != evil {
		t.Error("detail: the attacker text is not shown verbatim (or the payload of a type without a schema is not redacted)")
	}
}

// The live notice: an open outbox list hears that the outbox changed (an
// event's page hears about its event alone: record_live_test.go).
func TestOutboxPageHearsChangesOverItsSocket(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 100 * time.Millisecond})
	dead := plant(t, h, planted{status: "dead"})
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	_, body := b.get(t, h.base+"/outbox", "text/html")
	ws := doc(t, body).Find(`[ws-connect]`).AttrOr("ws-connect", "")
	if !strings.HasPrefix(ws, "/ws?") {
		t.Fatalf("ws-connect %q", ws)
	}
	conn, err := h.dialPath(t, b, ws)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Nothing changed yet: a few ticks pass (and no frame comes, see
	// TestOutboxPagesSocketGetsNoDashboardFragments).
	_, t0 := h.app.Feed().Stats()
	testkit.Eventually(t, "a few ticks", func() (bool, error) { _, t1 := h.app.Feed().Stats(); return t1 >= t0+2, nil })
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

// The outbox pages' socket carries their notice only, never the dashboard's
// fragments (they have no target there: htmx:oobErrorNoTarget in the
// browser's console on every tick): no frame at all while the figures a page
// shows stay put, then the notice when they move: the list's about the
// outbox, the event page's about its event.
func TestOutboxPagesSocketGetsNoDashboardFragments(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 100 * time.Millisecond})
	dead := plant(t, h, planted{status: "dead"})
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var frames []chan string
	for _, path := range []string{"/outbox", "/outbox/" + dead.String()} {
		_, body := b.get(t, h.base+path, "text/html")
		conn, err := h.dialPath(t, b, doc(t, body).Find(`[ws-connect]`).AttrOr("ws-connect", ""))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		defer conn.Close()
		ch := make(chan string, 16)
		go func() {
			defer close(ch)
			for {
				_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
				_, msg, err := conn.ReadMessage()
				if err != nil {
					return
				}
				select {
				case ch <- string(msg):
				case <-ctx.Done():
					return
				}
			}
		}()
		frames = append(frames, ch)
	}
	testkit.Eventually(t, "both sockets subscribed", func() (bool, error) { return h.app.Feed().Clients() == 2, nil })
	_, t0 := h.app.Feed().Stats()
	testkit.Eventually(t, "five ticks", func() (bool, error) { _, t1 := h.app.Feed().Stats(); return t1 >= t0+5, nil })
	for i, ch := range frames {
		select {
		case f := <-ch:
			t.Fatalf("page %d got a frame while nothing it shows moved: %.300s", i, f)
		default:
		}
	}
	if _, err := h.pool.Exec(ctx, `UPDATE outbox_event SET status = 'pending', dead_at = NULL WHERE id = $1`, dead); err != nil {
		t.Fatal(err)
	}
	if _, _, err := outbox.RecountBacklog(ctx, h.pool); err != nil { // a status changed by hand
		t.Fatal(err)
	}
	for i, ch := range frames {
		slot, want := []string{"#outbox-changed", "#record-changed"}[i], []string{"dead letters 1 → 0", "status dead → pending"}[i]
		for {
			f, ok := <-ch
			if !ok {
				t.Fatalf("page %d: the socket ended before the notice", i)
			}
			d := doc(t, f)
			if other := d.Find(`[hx-swap-oob]:not(` + slot + `)`); other.Length() > 0 {
				t.Fatalf("page %d got a fragment it has no target for: %.300s", i, f)
			}
			if strings.Contains(d.Find(slot).Text(), want) {
				break
			}
		}
	}
}

// An event's page keeps the deaths that retries undid: the retry clears the
// row's dead_at and restarts its attempts, and the timeline read only the
// row, so an event dead after 5 attempts and retried read "created → retry
// by oncall → dead" — a retry of an event that had never failed. The
// retry's audit row keeps what it undid.
func TestTheTimelineKeepsTheDeathARetryUndid(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	id := plant(t, h, planted{status: "dead", attempts: 5, lastError: "refused"})
	if _, err := h.pool.Exec(context.Background(), `UPDATE outbox_event SET dead_at = now() - interval '1 minute', dead_reason = 'attempts exhausted' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	b, token := h.signedIn(t, "oncall")
	resp, _ := h.postForm(t, b, "/outbox/"+id.String()+"/retry", url.Values{"csrf_token": {token}, "expected": {"dead"}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("retry: %d", resp.StatusCode)
	}
	// It fails twice more and dies again, as the relay would leave it.
	if _, err := h.pool.Exec(context.Background(), `UPDATE outbox_event SET status = 'dead', attempts = 2, dead_at = now(), dead_reason = 'attempts exhausted' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	_, body := b.get(t, h.base+"/outbox/"+id.String(), "text/html")
	var lines []string
	doc(t, body).Find(`[data-testid="timeline"] li`).Each(func(_ int, s *goquery.Selection) {
		lines = append(lines, strings.Join(strings.Fields(s.Text()), " "))
	})
	want := []string{"created", "5 publish attempts, then dead", "retry by oncall", "2 publish attempts since the last retry", "dead"}
	if len(lines) != len(want) {
		t.Fatalf("timeline %q, want %d lines like %q", lines, len(want), want)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Fatalf("timeline line %d is %q, want it to start %q (all: %q)", i, lines[i], w, lines)
		}
	}
	// The event's trace has both deaths too.
	_, trace := b.get(t, h.base+"/trace/event/"+id.String(), "text/html")
	if text := doc(t, trace).Text(); !strings.Contains(text, "Event dead-lettered (undone by the retry") || strings.Count(text, "Event dead-lettered") != 2 {
		t.Fatalf("the trace does not show both deaths: %q", strings.Join(strings.Fields(text), " "))
	}
}
