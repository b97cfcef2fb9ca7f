package web_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/payments/paymentstest"
	"github.com/sluice-dev/sluice/internal/testkit"
	"github.com/sluice-dev/sluice/web"
)

func (h *harness) dial(t *testing.T, b *browser, origin string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	d := websocket.Dialer{HandshakeTimeout: 10 * time.Second}
	if b != nil {
		d.Jar = b.Jar
	}
	hdr := http.Header{}
	if origin != "" {
		hdr.Set("Origin", origin)
	}
	return d.Dial("ws"+strings.TrimPrefix(h.base, "http")+"/ws", hdr)
}

func insertEvent(t *testing.T, h *harness, topic string) {
	t.Helper()
	ctx := context.Background()
	err := db.WithTx(ctx, h.pool, func(tx pgx.Tx) error {
		_, err := outbox.Insert(ctx, tx, outbox.Event{AggregateType: "test", AggregateID: "a1", Topic: topic,
			EventType: "test.happened.v1", Payload: json.RawMessage(`{"n":1}`)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// SECURITY.md case 5: refused before the upgrade.
func TestWebsocketRefusedBeforeUpgrade(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	if _, resp, err := h.dial(t, nil, h.base); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("without cookie: %v %v", resp, err)
	}
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	for _, origin := range []string{"https://evil.example", "", h.base + ".evil.example", strings.Replace(h.base, "127.0.0.1", "localhost", 1)} {
		_, resp, err := h.dial(t, b, origin)
		if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Fatalf("origin %q: %v %v", origin, resp, err)
		}
	}
	if n := h.countAudit(t, `action = 'request.denied' AND error_code = 'origin'`); n != 4 {
		t.Fatalf("%d origin refusals audited, want 4", n)
	}
	conn, _, err := h.dial(t, b, h.base)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
}

// The open page's numbers change without reload when the database changes.
func TestWebsocketPushesChanges(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 100 * time.Millisecond})
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	conn, _, err := h.dial(t, b, h.base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	insertEvent(t, h, "payments")
	deadline := time.Now().Add(30 * time.Second)
	for {
		_ = conn.SetReadDeadline(deadline)
		_, msg, err := conn.ReadMessage()
		if err != nil {
			t.Fatalf("no push showing the new event: %v", err)
		}
		s := string(msg)
		if !strings.Contains(s, `hx-swap-oob="true"`) {
			t.Fatalf("push without out-of-band swap: %.200s", s)
		}
		if strings.Contains(s, `data-testid="backlog">1<`) && strings.Contains(s, ">payments</span>") {
			return
		}
	}
}

// SECURITY.md case 5: logout closes the session's open sockets.
func TestLogoutClosesOpenSockets(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b := newBrowser(t)
	_, body := h.login(t, b, "oncall", "oncall", "")
	token := csrfField.FindStringSubmatch(body)[1]
	var conns []*websocket.Conn
	for i := 0; i < 2; i++ {
		c, _, err := h.dial(t, b, h.base)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	testkit.Eventually(t, "two sockets subscribed", func() (bool, error) { return h.app.Feed().Clients() == 2, nil })
	req, _ := http.NewRequest(http.MethodPost, h.base+"/logout", nil)
	req.Header.Set("X-CSRF-Token", token)
	resp, err := b.noRedirects().Do(req)
	if err != nil || resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %v %v", resp, err)
	}
	resp.Body.Close()
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		for {
			_, _, err := c.ReadMessage()
			if err == nil {
				continue
			}
			var ce *websocket.CloseError
			if !errors.As(err, &ce) || ce.Code != websocket.ClosePolicyViolation {
				t.Fatalf("socket not closed by logout: %v", err)
			}
			break
		}
	}
}

// The session re-check closes a socket whose session ended elsewhere (for
// example deleted by an administrator or expired).
func TestSocketClosesWhenSessionEnds(t *testing.T) {
	t.Parallel()
	h := start(t, options{recheck: 100 * time.Millisecond})
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	c, _, err := h.dial(t, b, h.base)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := h.pool.Exec(context.Background(), `DELETE FROM console_session`); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		if _, _, err = c.ReadMessage(); err != nil {
			break
		}
	}
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.ClosePolicyViolation {
		t.Fatalf("want close 1008, got %v", err)
	}
}

// The fan-out costs one snapshot statement per tick, whatever the number
// of browsers: 50 sockets, and the statements counted over ten ticks (a
// round trip each: the statement goes in a batch with its plan settings).
func TestFanOutCostsOneQueryPerTick(t *testing.T) {
	t.Parallel()
	const clients = 50 // one session's sockets, so the per-session limit is raised
	h := start(t, options{tick: 100 * time.Millisecond, configure: func(c *web.Config) { c.WSPerSession = clients }})
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	var received atomic.Int64
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := 0; i < clients; i++ {
		c, _, err := h.dial(t, b, h.base)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := false
			for ctx.Err() == nil {
				_ = c.SetReadDeadline(time.Now().Add(time.Second))
				if _, _, err := c.ReadMessage(); err != nil {
					if ne, ok := err.(interface{ Timeout() bool }); ok && ne.Timeout() {
						return
					}
					return
				}
				if !got {
					got = true
					received.Add(1)
				}
			}
		}()
	}
	testkit.Eventually(t, "50 sockets subscribed", func() (bool, error) { return h.app.Feed().Clients() == clients, nil })
	_, ticks0 := h.app.Feed().Stats()
	count0 := h.counter.n.Load()
	// Keep the page changing so every tick pushes to all 50.
	for i := 0; i < 10; i++ {
		insertEvent(t, h, "fanout")
		_, ticks := h.app.Feed().Stats()
		testkit.Eventually(t, "a tick", func() (bool, error) { _, t2 := h.app.Feed().Stats(); return t2 > ticks, nil })
	}
	_, ticks1 := h.app.Feed().Stats()
	count1 := h.counter.n.Load()
	ticks, statements := ticks1-ticks0, count1-count0
	if ticks < 10 {
		t.Fatalf("only %d ticks", ticks)
	}
	// A tick may be in flight at either end of the window.
	if statements < ticks-1 || statements > ticks+1 {
		t.Fatalf("%d snapshot statements for %d ticks with %d clients: want one per tick", statements, ticks, clients)
	}
	testkit.Eventually(t, "every client got pushes", func() (bool, error) { return received.Load() == clients, nil })
	cancel()
	wg.Wait()
}

// No PII on the dashboard: a customer canary planted in an unknown payment
// never reaches the page or a websocket frame.
func TestDashboardCarriesNoCustomerData(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 100 * time.Millisecond})
	b := newBrowser(t)
	h.login(t, b, "admin", "admin", "")
	conn, _, err := h.dial(t, b, h.base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	account := paymentstest.Account(t, h.pool, paymentstest.AccountOpts{ID: 1, Balance: "100"})
	// Customer fields in clear where envelopes belong: whatever the column
	// holds must not reach a page or a frame.
	paymentstest.Payment(t, h.pool, paymentstest.PaymentOpts{Account: account, Invoice: "inv-9", Amount: "42.42",
		Customer: map[string]string{"name": "CANARY-NAME", "email": "canary@example.com", "tax_id": "CANARY-TAX"}})
	var frames strings.Builder
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(frames.String(), "42.42 TRY") {
		_ = conn.SetReadDeadline(deadline)
		_, msg, err := conn.ReadMessage()
		if err != nil {
			t.Fatalf("the unknown payment never showed: %v", err)
		}
		frames.Write(msg)
	}
	_, page := b.get(t, h.base+"/", "text/html")
	for _, where := range []string{frames.String(), page} {
		if strings.Contains(strings.ToLower(where), "canary") {
			t.Fatal("customer data reached the dashboard")
		}
	}
}
