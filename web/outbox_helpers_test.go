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
	"github.com/gorilla/websocket"

	"github.com/sluice-dev/sluice/internal/outbox/outboxtest"
)

// planted is an outbox row written straight into the table, in any state.
type planted struct {
	aggType, aggID string
	seq            int64
	topic, etype   string
	payload        string // JSON
	headers        string // JSON object
	status         string // pending (default), dead, published, discarded
	attempts       int
	lastError      string
}

func plant(t *testing.T, h *harness, p planted) uuid.UUID {
	t.Helper()
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	if p.aggType == "" {
		p.aggType = "order"
	}
	if p.aggID == "" {
		p.aggID = id.String()
	}
	if p.seq == 0 {
		p.seq = 1
	}
	if p.topic == "" {
		p.topic = "orders"
	}
	if p.etype == "" {
		p.etype = "order.placed.v1"
	}
	if p.payload == "" {
		p.payload = `{"n": 1}`
	}
	if p.headers == "" {
		p.headers = `{}`
	}
	if p.status == "" {
		p.status = "pending"
	}
	ids := outboxtest.Insert(t, h.pool, outboxtest.Seed{ID: id, AggregateType: p.aggType, AggregateID: p.aggID, AggregateSeq: p.seq,
		Topic: p.topic, EventType: p.etype, Payload: p.payload, Headers: p.headers, Status: p.status,
		Attempts: p.attempts, LastError: p.lastError})
	return ids[0]
}

func (h *harness) status(t *testing.T, id uuid.UUID) string {
	t.Helper()
	var s string
	if err := h.pool.QueryRow(context.Background(), `SELECT status FROM outbox_event WHERE id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// csrf signs b's session's token from a page of the console.
func (h *harness) csrf(t *testing.T, b *browser) string {
	t.Helper()
	_, body := b.get(t, h.base+"/", "text/html")
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		t.Fatal("no CSRF token on the page")
	}
	return m[1]
}

// postForm posts a form to path on the console (see browser.postForm; the
// caller puts the CSRF token in form).
func (h *harness) postForm(t *testing.T, b *browser, path string, form url.Values) (*http.Response, string) {
	t.Helper()
	return b.postForm(t, h.base+path, "", form)
}

// dialPath opens the websocket at path (a page's ws-connect) as b.
func (h *harness) dialPath(t *testing.T, b *browser, path string) (*websocket.Conn, error) {
	t.Helper()
	d := websocket.Dialer{HandshakeTimeout: 10 * time.Second, Jar: b.Jar}
	c, _, err := d.Dial("ws"+strings.TrimPrefix(h.base, "http")+path, http.Header{"Origin": {h.base}})
	return c, err
}

// readFrames reads n frames and returns them joined.
func readFrames(c *websocket.Conn, n int) (string, error) {
	var sb strings.Builder
	for range n {
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, msg, err := c.ReadMessage()
		if err != nil {
			return sb.String(), err
		}
		sb.Write(msg)
	}
	return sb.String(), nil
}

// signedIn is a browser signed in as user, with its session's CSRF token.
func (h *harness) signedIn(t *testing.T, user string) (*browser, string) {
	t.Helper()
	b := newBrowser(t)
	h.login(t, b, user, user, "")
	return b, h.csrf(t, b)
}

// assertInert checks SECURITY.md case 6 on a page or fragment: the planted
// <script>, onmouseover and hx-get="/logout" are text, never markup.
func assertInert(t *testing.T, name, html string) {
	t.Helper()
	d := doc(t, html)
	d.Find("script").Each(func(_ int, s *goquery.Selection) {
		if strings.Contains(s.Text(), "alert") {
			t.Errorf("%s: a script element from data: %s", name, s.Text())
		}
	})
	if n := d.Find("[onmouseover]").Length(); n != 0 {
		t.Errorf("%s: %d elements with an onmouseover attribute", name, n)
	}
	if n := d.Find(`[hx-get="/logout"]`).Length(); n != 0 {
		t.Errorf("%s: %d elements with an hx-get from data", name, n)
	}
}
