package web

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/gorilla/websocket"
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/live"
)

const (
	wsReadLimit    = 4 << 10 // the dashboard sends nothing; control frames only
	wsWriteTimeout = 10 * time.Second
	wsPingEvery    = 30 * time.Second
	// wsPongWait: a peer that answers no ping for this long is gone. The
	// socket's own read deadline, set after the upgrade (the HTTP
	// server's timeouts end at the handshake).
	wsPongWait = wsPingEvery + wsWriteTimeout
)

// Close codes: htmx-ext-ws reconnects (with backoff) on 1006/1011/1012/1013
// only, so a slow or restarted client comes back, a logged-out one does not.
const (
	closeSessionEnded = websocket.ClosePolicyViolation // 1008: no reconnect
	closeTryLater     = websocket.CloseTryAgainLater   // 1013: dropped as slow
	closeRestart      = websocket.CloseServiceRestart  // 1012: shutting down
)

// ws streams the dashboard's live fragments. The route's guard has already
// authenticated and authorized the request; the Origin must be exactly the
// console's own. Both happen before the upgrade.
func (a *App) ws(c echo.Context) error {
	sess := auth.SessionFrom(c)
	req := c.Request()
	if !websocket.IsWebSocketUpgrade(req) {
		// Someone opened /ws in a tab: not a refusal, just the wrong door.
		c.Response().Header().Set("Upgrade", "websocket")
		return c.String(http.StatusUpgradeRequired, "This is the websocket endpoint of the live dashboard; open / instead.\n")
	}
	// A socket receives the fragments of the page that opened it; a page
	// the role may not see is refused before the upgrade.
	page := c.QueryParam("page")
	need, known := pagePermission(page)
	if !known {
		return echo.NewHTTPError(http.StatusNotFound)
	}
	if !sess.Can(need) {
		if err := a.guard.RecordDenied(req.Context(), sess, requestMeta(c), "GET /ws", "permission"); err != nil {
			return err
		}
		a.metrics.actions.WithLabelValues("request", "denied").Inc()
		return echo.NewHTTPError(http.StatusForbidden)
	}
	if req.Header.Get("Origin") != a.origin {
		if err := a.guard.RecordDenied(req.Context(), sess, requestMeta(c), "GET /ws", "origin"); err != nil {
			return err
		}
		a.metrics.actions.WithLabelValues("request", "denied").Inc()
		return echo.NewHTTPError(http.StatusForbidden)
	}
	// The limit is taken before the upgrade: one more socket than allowed
	// is refused with 429 (the open ones are kept).
	hash := sess.HashHex()
	if !a.reserveSocket(hash) {
		a.log.Warn("websocket refused: too many open for this session", "limit", a.cfg.WSPerSession)
		return c.String(http.StatusTooManyRequests, "Too many live connections for this session; close other console tabs.\n")
	}
	defer a.releaseSocket(hash)
	up := websocket.Upgrader{
		HandshakeTimeout: 10 * time.Second,
		CheckOrigin:      func(r *http.Request) bool { return r.Header.Get("Origin") == a.origin },
	}
	conn, err := up.Upgrade(c.Response(), req, nil)
	if err != nil {
		return nil // the upgrader has answered the client
	}
	defer conn.Close()
	conn.SetReadLimit(wsReadLimit)
	_ = conn.SetReadDeadline(time.Now().Add(wsPongWait))
	conn.SetPongHandler(func(string) error { return conn.SetReadDeadline(time.Now().Add(wsPongWait)) })
	watch := newOutboxWatch(req.URL.Query()) // an outbox page's live notice (outbox_live.go)
	var (
		client *live.Client
		record *recordWatch // a detail page's live notice (record_live.go)
	)
	if page == live.PageRecord {
		record = newRecordWatch(req.URL.Query())
	}
	if record != nil {
		client = a.feed.SubscribeRecord(hash, record.w)
	} else {
		client = a.feed.SubscribePage(hash, page)
	}
	defer a.feed.Unsubscribe(client)

	meta := requestMeta(c)
	ctx, cancel := context.WithCancel(req.Context())
	defer cancel()
	go func() { // reads only to see control frames and the close
		defer cancel()
		for {
			if _, _, err := conn.ReadMessage(); err != nil {
				return
			}
		}
	}()
	closeWith := func(code int, text string) {
		_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), time.Now().Add(time.Second))
	}
	recheck := time.NewTicker(a.cfg.SessionRecheck)
	defer recheck.Stop()
	ping := time.NewTicker(wsPingEvery)
	defer ping.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case msg := <-client.Messages():
			_ = conn.SetWriteDeadline(time.Now().Add(wsWriteTimeout))
			// An empty message (PageOutbox, PageRecord) only says a
			// snapshot was read: nothing to write but the notice.
			if len(msg) > 0 {
				if err := conn.WriteMessage(websocket.TextMessage, msg); err != nil {
					return nil
				}
			}
			if notice := a.outboxNotice(watch); notice != nil {
				if err := conn.WriteMessage(websocket.TextMessage, notice); err != nil {
					return nil
				}
			}
			if notice := a.recordNotice(client, record); notice != nil {
				if err := conn.WriteMessage(websocket.TextMessage, notice); err != nil {
					return nil
				}
			}
		case <-client.Done():
			switch client.Reason() {
			case live.ClosedSlow:
				closeWith(closeTryLater, "too slow")
			case live.ClosedSession:
				closeWith(closeSessionEnded, "session ended")
			case live.ClosedShutdown:
				closeWith(closeRestart, "restarting")
			}
			return nil
		case <-recheck.C:
			ok, err := a.sessions.Alive(ctx, sess.IDHash)
			if err == nil && !ok {
				closeWith(closeSessionEnded, "session ended")
				return nil
			}
			// A socket may stay open with no other request: it re-checks
			// the roles too (an ended session closes it through the feed).
			s, err := a.roles.Check(ctx, sess, meta)
			switch {
			case err == nil:
				sess = s
				// Roles reduced but not gone (auditor → viewer): the page's
				// permission is checked again, as at the upgrade, so the
				// socket stops receiving a page its user may no longer see.
				if !sess.Can(need) {
					closeWith(closeSessionEnded, "permission withdrawn")
					return nil
				}
			case errors.Is(err, auth.ErrSessionEnded), errors.Is(err, auth.ErrNoSession):
				closeWith(closeSessionEnded, "session ended")
				return nil
			}
		case <-ping.C:
			if err := conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(wsWriteTimeout)); err != nil {
				return nil
			}
		}
	}
}

// pagePermission is what a socket's page needs (known: the page exists).
// The dashboard's, the outbox pages' and the detail pages' feeds are every
// signed-in role's.
func pagePermission(page string) (need auth.Permission, known bool) {
	switch page {
	case live.PageDashboard, live.PageOutbox:
		return auth.PermView, true
	case live.PageRecord:
		// Both kinds a detail page watches (an event, a payment) are
		// shown to every role, and the socket pushes no more than the
		// page shows (statuses and counts, no customer data).
		return auth.PermView, true
	case live.PageJobs:
		return auth.PermOutboxAct, true
	case live.PageAudit:
		return auth.PermAudit, true
	case live.PageApprovals:
		return auth.PermPaymentsAct, true
	}
	return "", false
}

// reserveSocket counts one more open websocket for the session, unless it
// has WSPerSession already.
func (a *App) reserveSocket(hash string) bool {
	a.wsMu.Lock()
	defer a.wsMu.Unlock()
	if a.wsOpen[hash] >= a.cfg.WSPerSession {
		return false
	}
	a.wsOpen[hash]++
	return true
}

func (a *App) releaseSocket(hash string) {
	a.wsMu.Lock()
	defer a.wsMu.Unlock()
	if a.wsOpen[hash]--; a.wsOpen[hash] <= 0 {
		delete(a.wsOpen, hash)
	}
}
