package web

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/auth"
)

// route is one line of the route table: every route states who may call it.
// The guard enforces it; there are no exemptions by path.
type route struct {
	method  string
	path    string
	access  auth.Access
	handler echo.HandlerFunc
}

var (
	public  = auth.Access{Public: true}
	signOut = auth.Access{SignOut: true} // a signed-in user, or a stale cookie to clear
	page    = func(p auth.Permission) auth.Access { return auth.Access{Perm: p, Page: true} }
	api     = func(p auth.Permission) auth.Access { return auth.Access{Perm: p} }
)

func (a *App) routes() []route {
	rs := []route{
		{http.MethodGet, "/healthz", public, a.healthz},
		{http.MethodGet, "/readyz", public, a.readyz},
		{http.MethodGet, "/static/*", public, staticFiles()},
		{http.MethodGet, "/login", public, a.login},
		{http.MethodGet, "/auth/callback", public, a.callback},
		{http.MethodGet, "/signed-out", public, a.signedOut},
		{http.MethodPost, "/logout", signOut, a.logout},
		{http.MethodGet, "/", page(auth.PermView), a.dashboard},
		{http.MethodGet, "/ws", api(auth.PermView), a.ws},
		// The outbox and inbox screens and the single outbox actions.
		{http.MethodGet, "/outbox", page(auth.PermView), a.outboxList},
		{http.MethodGet, "/outbox/:id", page(auth.PermView), a.outboxEvent},
		{http.MethodPost, "/outbox/:id/retry", api(auth.PermOutboxAct), a.handleOutboxAction(actionRetry)},
		{http.MethodPost, "/outbox/:id/retry-now", api(auth.PermOutboxAct), a.handleOutboxAction(actionRetryNow)},
		{http.MethodPost, "/outbox/:id/dead-letter", api(auth.PermOutboxAct), a.handleOutboxAction(actionDeadLetter)},
		{http.MethodPost, "/outbox/:id/discard", api(auth.PermOutboxAct), a.handleOutboxAction(actionDiscard)},
		// Pause and resume a topic (topics.go).
		{http.MethodPost, "/outbox/topics/:topic/pause", api(auth.PermOutboxAct), a.handleTopic(true)},
		{http.MethodPost, "/outbox/topics/:topic/resume", api(auth.PermOutboxAct), a.handleTopic(false)},
		{http.MethodGet, "/inbox", page(auth.PermView), a.inboxPage},
		{http.MethodGet, "/relays", page(auth.PermView), a.relaysPage},
		// Open to every signed-in user: the handler checks CONSOLE_REVEAL_ROLES
		// (and audits a refusal), so the roles that may reveal are configurable.
		{http.MethodPost, "/pii/reveal", api(auth.PermView), a.reveal},
		// Bulk actions as durable jobs (bulk.go, jobs.go).
		{http.MethodGet, "/outbox/bulk", page(auth.PermOutboxAct), a.bulkForm},
		{http.MethodPost, "/outbox/bulk", api(auth.PermOutboxAct), a.bulk},
		{http.MethodPost, "/outbox/replay", api(auth.PermOutboxAct), a.replay},
		{http.MethodGet, "/jobs", page(auth.PermOutboxAct), a.jobsPage},
		{http.MethodGet, "/jobs/:id", page(auth.PermOutboxAct), a.jobPage},
		{http.MethodPost, "/jobs/:id/cancel", api(auth.PermOutboxAct), a.cancelJob},
		// The audit trail: list, row, streamed export, chain verification (audit*.go).
		{http.MethodGet, "/audit", page(auth.PermAudit), a.auditList},
		{http.MethodGet, "/audit/export", api(auth.PermAudit), a.auditExport},
		{http.MethodGet, "/audit/:seq", page(auth.PermAudit), a.auditEntry},
		{http.MethodPost, "/audit/verify", api(auth.PermAudit), a.auditVerify},
		// Payments: list, detail, inquire, resolve, four eyes, settlement
		// files, discrepancies (payments*.go, approvals.go, settlements.go,
		// discrepancies.go).
		{http.MethodGet, "/payments", page(auth.PermView), a.paymentList},
		{http.MethodPost, "/payments/search", api(auth.PermView), a.paymentSearchForm},
		{http.MethodGet, "/payments/search", page(auth.PermView), a.paymentSearch},
		{http.MethodGet, "/payments/settlements", page(auth.PermPaymentsAct), a.settlementForm},
		{http.MethodPost, "/payments/settlements", api(auth.PermPaymentsAct), a.settlementUpload},
		// Discrepancies: every role that sees payments sees the list; who
		// may act on payments closes one (discrepancies.go).
		{http.MethodGet, "/payments/discrepancies", page(auth.PermView), a.discrepancyList},
		{http.MethodPost, "/payments/discrepancies/:id/close", api(auth.PermPaymentsAct), a.closeDiscrepancy},
		{http.MethodGet, "/payments/:op", page(auth.PermView), a.paymentPage},
		{http.MethodPost, "/payments/:op/inquire", api(auth.PermPaymentsAct), a.inquirePayment},
		{http.MethodPost, "/payments/:op/resolve", api(auth.PermPaymentsAct), a.resolvePayment},
		{http.MethodGet, "/approvals", page(auth.PermPaymentsAct), a.approvalsPage},
		// One operation end to end: payment, aggregate or event (trace.go).
		{http.MethodGet, "/trace/:kind/:id", page(auth.PermView), a.trace},
		{http.MethodPost, "/approvals/:id/approve", api(auth.PermPaymentsAct), a.decideApproval(true)},
		{http.MethodPost, "/approvals/:id/reject", api(auth.PermPaymentsAct), a.decideApproval(false)},
	}
	if !a.separateMetrics() {
		rs = append(rs, route{http.MethodGet, "/metrics", public, echo.WrapHandler(a.metricsHandler())})
	}
	return rs
}
