package web_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/propagation"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/web"
)

const (
	testTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	testTraceparent = "00-" + testTraceID + "-00f067aa0ba902b7-01"
)

// insertTraced writes n events of one aggregate in one transaction, on a
// context carrying testTraceparent (as a traced request's would).
func insertTraced(t *testing.T, h *harness, aggType, aggID string, n int) []uuid.UUID {
	t.Helper()
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": testTraceparent})
	var ids []uuid.UUID
	err := db.WithTx(ctx, h.pool, func(tx pgx.Tx) error {
		for range n {
			ins, err := outbox.Insert(ctx, tx, outbox.Event{AggregateType: aggType, AggregateID: aggID,
				Topic: "orders", EventType: "order.placed.v1", Payload: []byte(`{"total":"10.00"}`)})
			if err != nil {
				return err
			}
			ids = append(ids, ins.ID)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

type traceStep struct{ kind, at, title, link string }

func traceSteps(t *testing.T, body string) []traceStep {
	t.Helper()
	var out []traceStep
	doc(t, body).Find(`[data-testid="step"]`).Each(func(_ int, s *goquery.Selection) {
		kind, _ := s.Attr("data-kind")
		at, _ := s.Attr("data-at")
		link, _ := s.Find(`[data-testid="step-link"]`).Attr("href")
		out = append(out, traceStep{kind: kind, at: at, title: s.Find(`[data-testid="step-title"]`).Text(), link: link})
	})
	return out
}

func kindCounts(steps []traceStep) map[string]int {
	m := map[string]int{}
	for _, s := range steps {
		m[s.kind]++
	}
	return m
}

// assertTimeOrder checks that the steps are in time order.
func assertTimeOrder(t *testing.T, steps []traceStep) {
	t.Helper()
	var prev time.Time
	for i, s := range steps {
		at, err := time.Parse(time.RFC3339Nano, s.at)
		if err != nil {
			t.Fatalf("step %d (%s) time %q: %v", i+1, s.title, s.at, err)
		}
		if at.Before(prev) {
			t.Errorf("step %d (%s) at %s is before the step before it (%s)", i+1, s.title, at, prev)
		}
		prev = at
	}
}

// An order aggregate and one of its events, relayed through embedded NATS
// and applied by the reference consumer: the trace shows each event's
// life, the consumer's inbox row and effect, and the audit row about it, in
// time order, with the trace id of the writer's traceparent to copy (no
// trace UI configured, so no link). A viewer may read it; the audit row is
// not linked for a viewer, who may not open the audit pages.
func TestTraceOfAnAggregateAndAnEvent(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	flowing(t, h)
	order := uuid.NewString()
	insertTraced(t, h, "order", order, 2)
	ids := consumedAll(t, h, "order", order, 2)
	seqs := record(t, h, audit.Event{ActorSub: "sub-carol", ActorName: "Carol", Action: "outbox.retry",
		TargetType: "outbox_event", TargetID: ids[0].String(), Reason: `<script>alert(1)</script>`})
	// Rows of the audit trail that are not the event's history: a reveal
	// of one of its fields and a refused attempt. Only who may see the
	// trail (auditor, admin) sees them in a trace.
	record(t, h, audit.Event{ActorSub: "sub-dan", ActorName: "Dan", Action: "pii.reveal", TargetType: "outbox_event",
		TargetID: ids[0].String(), Reason: "customer asked"},
		audit.Event{ActorSub: "sub-mallory", ActorName: "Mallory", Action: "outbox.discard", TargetType: "outbox_event",
			TargetID: ids[0].String(), Outcome: audit.OutcomeDenied, ErrorCode: "permission"})
	b, _ := h.signedIn(t, "support")

	resp, body := b.get(t, h.base+"/trace/aggregate/order:"+order, "text/html")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("aggregate trace: %d", resp.StatusCode)
	}
	steps := traceSteps(t, body)
	got := kindCounts(steps)
	for kind, n := range map[string]int{"event": 2, "publish": 2, "inbox": 2, "effect": 2, "audit": 1} {
		if got[kind] != n {
			t.Errorf("%d %s steps, want %d (all: %v)", got[kind], kind, n, got)
		}
	}
	assertTimeOrder(t, steps)
	if steps[0].kind != "event" {
		t.Errorf("first step %q, want the first event written", steps[0].title)
	}
	links := map[string]bool{}
	for _, s := range steps {
		links[s.link] = true
		if s.kind == "audit" && s.link != "" {
			t.Errorf("a viewer's trace links the audit row to %s", s.link)
		}
	}
	for _, id := range ids {
		if !links["/outbox/"+id.String()] {
			t.Errorf("no link to event %s's page", id)
		}
	}
	if !links["/inbox"] {
		t.Error("no link to the inbox page")
	}
	d := doc(t, body)
	if got := d.Find(`h1 [data-testid="copy-id"]`).AttrOr("data-copy", ""); got != order {
		t.Errorf("the title's copy button copies %q, want the aggregate id %q", got, order)
	}
	if got := d.Find(`[data-testid="trace-id"]`).Text(); got != testTraceID {
		t.Errorf("trace id %q, want %q", got, testTraceID)
	}
	if d.Find(`[data-testid="trace-link"]`).Length() != 0 {
		t.Error("a trace link without CONSOLE_TRACE_URL")
	}
	if strings.Contains(body, "<script>alert(1)") || !strings.Contains(d.Find(`[data-testid="trace"]`).Text(), "<script>alert(1)</script>") {
		t.Error("the audit reason is not shown as inert text")
	}
	if n := d.Find(`[data-testid="lag"]`).Length(); n != len(steps) || strings.TrimSpace(d.Find(`[data-testid="lag"]`).Eq(1).Text()) == "" {
		t.Errorf("lags: %d cells for %d steps, second %q", n, len(steps), d.Find(`[data-testid="lag"]`).Eq(1).Text())
	}

	if strings.Contains(body, "pii.reveal") || strings.Contains(body, "Mallory") {
		t.Error("a viewer's trace shows a reveal or a refused attempt")
	}

	// An auditor gets the audit row linked, and every row.
	ab, _ := h.signedIn(t, "auditor")
	_, body = ab.get(t, h.base+"/trace/aggregate/order:"+order, "text/html")
	found := false
	for _, s := range traceSteps(t, body) {
		found = found || (s.kind == "audit" && s.link == "/audit/"+itoa(seqs[0]))
	}
	if !found {
		t.Error("the auditor's trace does not link the audit row")
	}
	if got := kindCounts(traceSteps(t, body))["audit"]; got != 3 {
		t.Errorf("the auditor's trace has %d audit steps, want 3", got)
	}

	// One event: its own life only, and a way to the whole aggregate.
	resp, body = b.get(t, h.base+"/trace/event/"+ids[1].String(), "text/html")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("event trace: %d", resp.StatusCode)
	}
	steps = traceSteps(t, body)
	got = kindCounts(steps)
	if got["event"] != 1 || got["publish"] != 1 || got["inbox"] != 1 || got["effect"] != 1 || got["audit"] != 0 {
		t.Errorf("event trace steps %v, want its own event, publish, inbox row and effect", got)
	}
	assertTimeOrder(t, steps)
	d = doc(t, body)
	if href, _ := d.Find(`[data-testid="aggregate-trace"]`).Attr("href"); href != "/trace/aggregate/order:"+order {
		t.Errorf("aggregate trace link %q", href)
	}
	// The event page links to the trace.
	_, body = b.get(t, h.base+"/outbox/"+ids[1].String(), "text/html")
	if href, _ := doc(t, body).Find(`[data-testid="trace-link"]`).Attr("href"); href != "/trace/event/"+ids[1].String() {
		t.Errorf("event page's trace link %q", href)
	}
}

// What the trace page refuses, and how.
func TestTraceRefusals(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	order := uuid.NewString()
	insertTraced(t, h, "order", order, 1)

	anon := newBrowser(t)
	resp, err := anon.noRedirects().Do(mustRequest(t, h.base+"/trace/aggregate/order:"+order))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 3 || !strings.HasPrefix(resp.Header.Get("Location"), "/login") {
		t.Errorf("anonymous: %d to %q, want a redirect to /login", resp.StatusCode, resp.Header.Get("Location"))
	}

	b, _ := h.signedIn(t, "support")
	for _, tc := range []struct {
		path   string
		status int
		says   string
	}{
		{"/trace/invoice/" + order, http.StatusNotFound, "payment"},
		{"/trace/payment/not-a-uuid", http.StatusBadRequest, "operation id"},
		{"/trace/payment/" + uuid.NewString(), http.StatusNotFound, ""},
		{"/trace/event/123", http.StatusBadRequest, "event id"},
		{"/trace/event/" + uuid.NewString(), http.StatusNotFound, ""},
		{"/trace/aggregate/order", http.StatusBadRequest, "type:id"},
		{"/trace/aggregate/order:" + uuid.NewString(), http.StatusNotFound, "No outbox event"},
		{"/trace/aggregate/order:" + strings.Repeat("x", 400), http.StatusBadRequest, "300"},
	} {
		resp, body := b.get(t, h.base+tc.path, "text/html")
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d, want %d", tc.path, resp.StatusCode, tc.status)
			continue
		}
		if tc.says != "" && !strings.Contains(body, tc.says) {
			t.Errorf("%s: the page does not say %q", tc.path, tc.says)
		}
	}
}

// An aggregate id with characters a path must escape is found through the
// link the event's trace gives.
func TestTraceOfAnAggregateWithAnEscapedID(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	id := "tenant 7/order #42?x=%41"
	ids := insertTraced(t, h, "order", id, 1)
	b, _ := h.signedIn(t, "support")
	_, body := b.get(t, h.base+"/trace/event/"+ids[0].String(), "text/html")
	href, _ := doc(t, body).Find(`[data-testid="aggregate-trace"]`).Attr("href")
	resp, body := b.get(t, h.base+href, "text/html")
	if resp.StatusCode != http.StatusOK || kindCounts(traceSteps(t, body))["event"] != 1 {
		t.Fatalf("%s: %d, steps %v", href, resp.StatusCode, kindCounts(traceSteps(t, body)))
	}
	if !strings.Contains(doc(t, body).Find("h1").Text(), id) {
		t.Errorf("title %q, want the aggregate id %q", doc(t, body).Find("h1").Text(), id)
	}
}

// With CONSOLE_TRACE_URL the trace id links to the trace UI.
func TestTraceLinksTheTraceUI(t *testing.T) {
	t.Parallel()
	h := start(t, options{configure: func(c *web.Config) { c.TraceURL = "https://jaeger.example/trace/{trace_id}" }})
	order := uuid.NewString()
	insertTraced(t, h, "order", order, 1)
	b, _ := h.signedIn(t, "support")
	_, body := b.get(t, h.base+"/trace/aggregate/order:"+order, "text/html")
	d := doc(t, body)
	if href, _ := d.Find(`[data-testid="trace-link"]`).Attr("href"); href != "https://jaeger.example/trace/"+testTraceID {
		t.Errorf("trace link %q", href)
	}
	if d.Find(`[data-testid="trace-id"]`).Length() != 0 {
		t.Error("the id is shown unlinked too")
	}
}

func mustRequest(t *testing.T, u string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/html")
	return req
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
