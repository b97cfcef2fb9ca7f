package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"
	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/live"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/pii"
	"github.com/sluice-dev/sluice/views"
)

// auditTargetPayment is the audit trail's target type of a payment (its
// id is the operation id).
const auditTargetPayment = payments.AggregateType

// paymentForm is GET /payments's query, parsed.
type paymentForm struct {
	raw    views.PaymentFilterForm
	filter payments.Filter
	page   payments.Page
}

func parsePaymentForm(q url.Values) (paymentForm, error) {
	f := paymentForm{raw: views.PaymentFilterForm{
		Status: q.Get("status"), Merchant: q.Get("merchant_id"), Invoice: q.Get("invoice_id"),
		OperationID: strings.TrimSpace(q.Get("operation_id")), AmountMin: strings.TrimSpace(q.Get("amount_min")),
		AmountMax: strings.TrimSpace(q.Get("amount_max")), From: q.Get("created_from"), To: q.Get("created_to"),
	}}
	for name, v := range map[string]string{"status": f.raw.Status, "merchant": f.raw.Merchant, "invoice": f.raw.Invoice,
		"operation id": f.raw.OperationID, "amount from": f.raw.AmountMin, "amount to": f.raw.AmountMax, "from": f.raw.From, "to": f.raw.To} {
		if len(v) > maxFilterField {
			return f, fmt.Errorf("%w: %s is longer than %d characters", payments.ErrInvalidFilter, name, maxFilterField)
		}
	}
	f.filter = payments.Filter{Status: payments.Status(f.raw.Status), MerchantID: f.raw.Merchant, InvoiceID: f.raw.Invoice}
	if f.raw.OperationID != "" {
		op, err := uuid.Parse(f.raw.OperationID)
		if err != nil {
			return f, fmt.Errorf("%w: operation id is not a UUID", payments.ErrInvalidFilter)
		}
		f.filter.OperationID = op
	}
	for _, a := range []struct {
		name, v string
		dst     *decimal.Decimal
	}{{"amount from", f.raw.AmountMin, &f.filter.AmountMin}, {"amount to", f.raw.AmountMax, &f.filter.AmountMax}} {
		if a.v == "" {
			continue
		}
		d, err := decimal.NewFromString(a.v)
		if err != nil {
			return f, fmt.Errorf("%w: %s %q is not an amount: %s", payments.ErrInvalidFilter, a.name, a.v, amountSpelling(a.v))
		}
		*a.dst = d
	}
	var err error
	if f.filter.CreatedFrom, err = parseFormTime("created from", f.raw.From); err != nil {
		return f, fmt.Errorf("%w: %w", payments.ErrInvalidFilter, err)
	}
	if f.filter.CreatedTo, err = parseFormTime("created before", f.raw.To); err != nil {
		return f, fmt.Errorf("%w: %w", payments.ErrInvalidFilter, err)
	}
	f.page.After = q.Get("after")
	if len(f.page.After) > 64 {
		return f, payments.ErrInvalidCursor
	}
	return f, f.filter.Validate()
}

// amountSpelling tells how to write an amount the filter refused. A value
// written with a decimal comma or with thousands separators ("12,50",
// "1.234,56", "1,234.56") is answered with the same amount as the filter
// reads it, so the correction never names another amount (the hint used
// to say "write 125.50" to someone who typed 12,50). A lone comma before
// three digits ("1,234") may be either, so both readings are named.
func amountSpelling(v string) string {
	const rule = "a dot before the cents, no thousands separators"
	s := strings.NewReplacer(" ", "", "\u00a0", "", "\u202f", "", "'", "", "_", "").Replace(v)
	dot, comma := strings.LastIndex(s, "."), strings.LastIndex(s, ",")
	var want []string
	switch {
	case dot >= 0 && comma >= 0:
		// Both: the last one marks the cents, the other groups thousands.
		decimalSep, group, last := ".", ",", dot
		if comma > dot {
			decimalSep, group, last = ",", ".", comma
		}
		if grouped(s[:last], group) && !strings.Contains(s[last+1:], group) {
			want = []string{strings.Replace(strings.ReplaceAll(s, group, ""), decimalSep, ".", 1)}
		}
	case comma >= 0 && strings.Count(s, ",") == 1 && len(s)-comma-1 == 3:
		want = []string{strings.Replace(s, ",", "", 1), strings.Replace(s, ",", ".", 1)}
	case comma >= 0 && strings.Count(s, ",") == 1:
		want = []string{strings.Replace(s, ",", ".", 1)}
	case comma >= 0:
		if grouped(s, ",") {
			want = []string{strings.ReplaceAll(s, ",", "")}
		}
	case strings.Count(s, ".") > 1:
		if grouped(s, ".") {
			want = []string{strings.ReplaceAll(s, ".", "")}
		}
	default:
		want = []string{s}
	}
	if len(want) == 0 {
		return "write digits with " + rule + ", as 12.50"
	}
	for _, w := range want {
		if _, err := decimal.NewFromString(w); err != nil || w == "" {
			return "write digits with " + rule + ", as 12.50"
		}
	}
	if len(want) == 2 {
		return "write " + want[0] + " or " + want[1] + " (" + rule + ")"
	}
	return "write " + want[0] + " (" + rule + ")"
}

// grouped: s is digits in groups of three after its first, split by sep
// ("1,234,567"), as thousands separators write them.
func grouped(s, sep string) bool {
	for i, g := range strings.Split(s, sep) {
		if i > 0 && len(g) != 3 {
			return false
		}
	}
	return true
}

// paymentProblem is what the list says about a filter or cursor it refused.
func paymentProblem(err error) string {
	switch {
	case errors.Is(err, payments.ErrInvalidCursor):
		return "The page link is out of date or altered (its position belongs to another filter, or cannot be read). Start again from the first page."
	case errors.Is(err, payments.ErrInvalidFilter):
		msg := err.Error()
		if i := strings.LastIndex(msg, "invalid filter: "); i >= 0 {
			msg = msg[i+len("invalid filter: "):]
		}
		msg = strings.TrimPrefix(msg, outbox.ErrInvalidFilter.Error()+": ")
		return strings.ToUpper(msg[:1]) + msg[1:] + "."
	}
	return ""
}

// paymentList is GET /payments: a keyset page, unknown payments first.
func (a *App) paymentList(c echo.Context) error {
	ctx := c.Request().Context()
	f, err := parsePaymentForm(c.QueryParams())
	d := views.PaymentListData{Form: f.raw, CanSearch: a.kr != nil, CanSettle: may(c, auth.PermPaymentsAct), Discrepancies: a.links.Discrepancies}
	if err == nil {
		var page payments.ListPage
		if page, err = payments.ListPayments(ctx, a.pool, f.filter, f.page); err == nil {
			d.Rows, d.ReadAt = page.Rows, page.ReadAt
			if page.Next != "" {
				d.NextURL = paymentListURL(f.raw, page.Next)
			}
			if f.page.After != "" {
				d.FirstURL = paymentListURL(f.raw, "")
			}
			d.Total, err = listTotal(f.page.After == "", len(page.Rows), page.Next, func() (db.Total, error) {
				return payments.CountPayments(ctx, a.pool, f.filter)
			})
			d.Counted = err == nil
		}
	}
	if d.Problem = paymentProblem(err); d.Problem != "" {
		d.Rows, d.NextURL = nil, ""
		return render(c, http.StatusBadRequest, views.PaymentList(a.page(c, views.ListTitle("Payments", f.raw.Describe()), "/payments"), d))
	}
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.PaymentList(a.page(c, views.ListTitle("Payments", f.raw.Describe()), "/payments"), d))
}

// searchPlace binds a customer search's sealed terms to the user who made
// it (pii.Keyring.Seal, the console's personal-data keys): the results page
// reads again for them in any of their sessions (after the sign-in that
// acting on money asks for every 15 minutes, too: a drill lost its results
// there when the key came from the session), never for another user, and
// nothing readable is in the address, the history or a proxy's log.
func searchPlace(sess *auth.Session) pii.Place {
	return pii.Place{Kind: "console.payments.search", ID: staffID(sess)}
}

// SearchResultsFor is how long a search's results page reads again (Back,
// reload) without being a new search: the typed search was audited and
// counted once, when it was made. Past it, the page says to search again.
const SearchResultsFor = 30 * time.Minute

// paymentSearchForm is POST /payments/search, the search itself: it checks
// what was typed, counts it against the user's limit, audits it (a keyed
// hash of the value, never the value), and answers 303 to GET
// /payments/search with the terms and the time sealed for this user
// (searchPlace). The results page is then a page like any other: Back
// returns to it and a reload reads it, without the browser offering to
// send the form again (a reviewer met that on support's main path), and
// without counting or auditing a search nobody typed again.
func (a *App) paymentSearchForm(c echo.Context) error {
	c.Response().Header().Set("Cache-Control", "no-store")
	if a.kr == nil {
		return &publicError{status: http.StatusServiceUnavailable, msg: "This console holds no personal-data keys (PII_KEYS), so it cannot search by customer."}
	}
	field, typed := c.FormValue("customer_field"), c.FormValue("customer")
	if len(typed) > 200 {
		return badRequest("The value to look for is longer than 200 characters.")
	}
	if payments.CheckCustomerSearch(field, typed) != nil {
		return badRequest("Choose email or tax id and type the exact value to look for.")
	}
	ctx := c.Request().Context()
	sess := auth.SessionFrom(c)
	meta := requestMeta(c)
	ev := audit.Event{
		ActorIss: sess.Issuer, ActorSub: sess.Subject, ActorName: sess.Name, ActorRoles: sess.RoleNames(),
		SessionHash: sess.HashHex(), Action: "payments.search", TargetType: "customer", TargetID: a.kr.SearchHash(field, typed),
		Outcome: audit.OutcomeOK, RequestID: meta.RequestID, IP: meta.IP, UserAgent: meta.UserAgent,
	}
	if !a.searches.Allow(staffID(sess)) {
		if err := a.auditDenied(ctx, ev, "rate_limited"); err != nil {
			return err
		}
		return &publicError{status: http.StatusTooManyRequests, msg: fmt.Sprintf("At most %d customer searches a minute: wait a moment, then search again.", SearchesPerMinute)}
	}
	found, err := payments.FindByCustomer(ctx, a.pool, a.kr, field, typed, payments.SearchPage{Limit: payments.MaxPageLimit})
	if err != nil {
		return err
	}
	ev.After, _ = json.Marshal(map[string]any{"field": field, "found": len(found)})
	if err := db.WithTx(ctx, a.pool, func(tx pgx.Tx) error { return audit.Record(ctx, tx, ev) }); err != nil {
		return err
	}
	a.metrics.actions.WithLabelValues(ev.Action, "ok").Inc()
	q, err := a.kr.Seal(searchPlace(sess), "terms", strconv.FormatInt(a.now().Unix(), 10)+"\x00"+field+"\x00"+typed)
	if err != nil {
		return err
	}
	return c.Redirect(http.StatusSeeOther, "/payments/search?"+url.Values{"q": {q}}.Encode())
}

// paymentSearch is GET /payments/search?q=…: the results of a search this
// user made (paymentSearchForm) less than SearchResultsFor ago, read
// again by the value's blind index. It neither audits nor counts: the
// search was, when it was made; a page load is no new search (a GET that
// audited made Back, reload and a link followed cross-site each count as
// one, and burnt the user's limit).
func (a *App) paymentSearch(c echo.Context) error {
	c.Response().Header().Set("Cache-Control", "no-store")
	if a.kr == nil {
		return &publicError{status: http.StatusServiceUnavailable, msg: "This console holds no personal-data keys (PII_KEYS), so it cannot search by customer."}
	}
	sess := auth.SessionFrom(c)
	q := c.QueryParam("q")
	var (
		terms string
		err   error
	)
	// Only what this console seals now (its primary key, the envelope
	// that binds the place): an older envelope binds the field alone.
	if len(q) <= 2048 && a.kr.Current(q) {
		terms, err = a.kr.Open(searchPlace(sess), "terms", q)
	}
	parts := strings.SplitN(terms, "\x00", 3)
	if q == "" || err != nil || len(parts) != 3 {
		return badRequest("This search cannot be read here: it was made by another user, or the address was changed. Search again from the payments list.")
	}
	made, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil || a.now().Sub(time.Unix(made, 0)) > SearchResultsFor {
		return badRequest(fmt.Sprintf("These results are from a search made more than %s ago. Search again from the payments list.", views.Age(SearchResultsFor)))
	}
	field, typed := parts[1], parts[2]
	ctx := c.Request().Context()
	found, err := payments.FindByCustomer(ctx, a.pool, a.kr, field, typed, payments.SearchPage{Limit: payments.MaxPageLimit})
	if errors.Is(err, payments.ErrInvalidSearch) {
		return badRequest("Choose email or tax id and type the exact value to look for.")
	}
	if err != nil {
		return err
	}
	d := views.PaymentListData{CanSearch: true, Rows: found, ReadAt: a.now(),
		Searched: map[string]string{"email": "email", "tax_id": "tax id"}[field]}
	return render(c, http.StatusOK, views.PaymentList(a.page(c, "Payments of one customer", "/payments"), d))
}

func paymentListURL(raw views.PaymentFilterForm, after string) string {
	v := raw.Values()
	if after != "" {
		v.Set("after", after)
	}
	if len(v) == 0 {
		return "/payments"
	}
	return "/payments?" + v.Encode()
}

// operationID reads the {op} of a /payments/{op} route: a UUID, or 400
// before any query.
func operationID(c echo.Context) (uuid.UUID, error) {
	raw := c.Param("op")
	op, err := uuid.Parse(raw)
	if err != nil || len(raw) != 36 {
		return uuid.Nil, badRequest("That is not an operation id: an id is a UUID such as 0190f3a2-7c1e-7d4b-9a51-1f2e3d4c5b6a.")
	}
	return op, nil
}

// paymentDone are the notices after a redirect (fixed texts: the query
// never reaches the page).
var paymentDone = map[string]string{
	"resolved":           "Resolved: the payment left unknown once; its reservation, ledger and event changed in the same commit as your audit row.",
	"requested":          "Requested: the amount is above the four-eyes threshold, so nothing moves until a different operator approves it on the Approvals page.",
	"inquired":           "Inquired: the provider's answer is recorded below.",
	"discrepancy_closed": "Closed: the discrepancy records who closed it and why, with its audit row; the payment's status and books are as they were.",
}

// paymentPage is GET /payments/{op}.
func (a *App) paymentPage(c echo.Context) error {
	op, err := operationID(c)
	if err != nil {
		return err
	}
	d, err := a.paymentData(c.Request().Context(), c, op)
	if err != nil {
		return err
	}
	d.Notice = paymentDone[c.QueryParam("done")]
	return render(c, http.StatusOK, views.PaymentPage(a.page(c, "Payment "+views.ShortID(op.String()), "/payments"), d))
}

// revealers names who may reveal personal data (CONSOLE_REVEAL_ROLES), for
// a page that tells someone who may not whom to ask: "operators and admins".
func revealers(roles []auth.Role) string {
	words := make([]string, len(roles))
	for i, r := range roles {
		words[i] = string(r) + "s"
	}
	return views.AndList(words)
}

// paymentAuditRows is how many audit rows the payment's page lists.
const paymentAuditRows = 50

// paymentData reads everything the payment's page shows. Customer fields
// are shown masked: opened and masked by the payment table's schema when
// the console holds the keys (PII_KEYS), else as sealed; a permitted user
// may reveal one (POST /pii/reveal).
func (a *App) paymentData(ctx context.Context, c echo.Context, op uuid.UUID) (views.PaymentData, error) {
	p, err := payments.Get(ctx, a.pool, op)
	if err != nil {
		return views.PaymentData{}, err
	}
	d := views.PaymentData{P: p, CanInquire: a.inquirer != nil,
		Threshold: a.cfg.FourEyesAbove.StringFixed(2), FourEyes: p.Amount.GreaterThan(a.cfg.FourEyesAbove)}
	d.Customer = payments.MaskCustomer(a.kr, p)
	if a.links.Trace {
		d.Trace = traceURL(traceKindPayment, op.String())
	}
	d.Sealed = a.kr == nil
	if a.kr != nil && !a.mayReveal(c) {
		d.Revealers = revealers(a.cfg.RevealRoles)
	}
	if a.kr != nil && a.mayReveal(c) {
		for _, field := range sortedFields(p.Customer) {
			d.Reveal = append(d.Reveal, views.RevealField{TargetType: auditTargetPayment, TargetID: op.String(), Field: field})
		}
	}
	sess := auth.SessionFrom(c)
	d.CanAct = sess != nil && sess.Can(auth.PermPaymentsAct)
	d.SeeAudit = sess != nil && sess.Can(auth.PermAudit)
	if d.CanAct && a.loginTooOld(sess) {
		d.ReauthURL = paymentReauthURL("/payments/" + op.String())
	}
	if rec, err := payments.RecordByOperation(ctx, a.pool, op); err == nil {
		rec.ResponseBody = nil // the stored body is the client's; only its status is shown
		d.Record = &rec
	} else if !errors.Is(err, payments.ErrNotFound) {
		return d, err
	}
	if r, err := payments.ReservationOf(ctx, a.pool, op); err == nil {
		d.Reservation = &r
	} else if !errors.Is(err, payments.ErrNotFound) {
		return d, err
	}
	if d.Calls, err = payments.ProviderCalls(ctx, a.pool, op); err != nil {
		return d, err
	}
	if d.Ledger, err = payments.LedgerOf(ctx, a.pool, op); err != nil {
		return d, err
	}
	events, err := outbox.List(ctx, a.pool, outbox.Filter{AggregateType: payments.AggregateType, AggregateID: op.String()}, outbox.Page{Oldest: true, Limit: 50})
	if err != nil {
		return d, err
	}
	d.Events = events.Rows
	if d.Discrepancy, err = payments.DiscrepanciesOf(ctx, a.pool, op); err != nil {
		return d, err
	}
	if d.Approvals, err = payments.ApprovalsOf(ctx, a.pool, op); err != nil {
		return d, err
	}
	if d.Audit, err = audit.ForTarget(ctx, a.pool, auditTargetPayment, op.String(), paymentAuditRows); err != nil {
		return d, err
	}
	if p.ResolvedBy != "" {
		names, settledBy := views.StaffNames{}, ""
		names.AddApprovals(d.Approvals)
		for _, e := range d.Audit {
			names.Add(e.ActorIss, e.ActorSub, e.ActorName)
			if e.Action == payments.ActionSettle && e.Outcome == audit.OutcomeOK {
				settledBy = e.ActorName
			}
		}
		d.ResolvedBy = views.ResolvedBy(p.ResolvedBy, names, settledBy)
	}
	if err := a.pool.QueryRow(ctx, `SELECT statement_timestamp()`).Scan(&d.ReadAt); err != nil {
		return d, err
	}
	// The live notice's mark: the status and requests this page shows.
	// ReadAt is after every read above, so a state the feed read later is
	// never older than the page's.
	d.Live = recordWatchURL(live.Watch{Kind: live.KindPayment, ID: op}, paymentMark(payments.StateOf(p, d.Approvals)), d.ReadAt)
	return d, nil
}

// loginTooOld: money-moving actions (resolve, approve, a settlement file) need a sign-in no
// older than CONSOLE_RECENT_LOGIN.
func (a *App) loginTooOld(sess *auth.Session) bool {
	return a.now().Sub(sess.AuthTime) > a.cfg.RecentLogin
}

// paymentReauthURL signs in again at the provider (prompt=login, max_age=0)
// and comes back to next (the form).
func paymentReauthURL(next string) string {
	return "/login?reauth=1&next=" + url.QueryEscape(next)
}

func sortedFields(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
