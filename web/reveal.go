package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/pii"
	"github.com/sluice-dev/sluice/views"
)

// fieldPath is what a reveal may name: a dotted path of JSON keys or a
// column's field name, never anything a query or a template could read
// as syntax.
var fieldPath = regexp.MustCompile(`^[a-z][a-z0-9_]{0,40}(\.[a-z][a-z0-9_]{0,40}){0,3}$`)

// revealForm is POST /pii/reveal: one field of one record, and why.
type revealForm struct {
	targetType string // outbox_event or payment
	id         uuid.UUID
	field      string
	reason     string
}

func parseRevealForm(c echo.Context) (revealForm, error) {
	f := revealForm{targetType: c.FormValue("target_type"), field: c.FormValue("field"), reason: strings.TrimSpace(c.FormValue("reason"))}
	if f.targetType != auditTargetOutbox && f.targetType != auditTargetPayment {
		return f, badRequest("A reveal names an outbox event or a payment.")
	}
	id, err := uuid.Parse(c.FormValue("target_id"))
	if err != nil {
		return f, badRequest("The record to reveal is not an id.")
	}
	f.id = id
	if !fieldPath.MatchString(f.field) {
		return f, badRequest("The field to reveal is not a field name.")
	}
	if utf8.RuneCountInString(f.reason) > maxReason || !utf8.ValidString(f.reason) {
		return f, badRequest(fmt.Sprintf("The reason is longer than %d characters.", maxReason))
	}
	return f, nil
}

// reveal opens one sealed field of one record for a permitted user who
// gave a reason, and answers it once: Cache-Control no-store, swapped into
// the page in place (gone on reload), never pushed over a websocket. The
// audit row (field, target, reason — never the value) commits in the same
// transaction as the read; no row, no value. A value whose key is missing
// answers "undecryptable" and the page keeps working.
func (a *App) reveal(c echo.Context) error {
	c.Response().Header().Set("Cache-Control", "no-store")
	f, perr := parseRevealForm(c)
	ctx := c.Request().Context()
	sess := auth.SessionFrom(c)
	meta := requestMeta(c)
	ev := audit.Event{
		ActorIss: sess.Issuer, ActorSub: sess.Subject, ActorName: sess.Name, ActorRoles: sess.RoleNames(),
		SessionHash: sess.HashHex(), Action: "pii.reveal", TargetType: f.targetType, TargetID: f.id.String(),
		Reason: f.reason, After: revealedField(f.field), RequestID: meta.RequestID, IP: meta.IP, UserAgent: meta.UserAgent,
	}
	if perr != nil {
		// Permission first: a user who may not reveal is refused and
		// audited as such whatever the form holds, and the audit row keeps
		// nothing of a form it could not read.
		if !a.mayReveal(c) {
			ev.TargetType, ev.TargetID, ev.Reason, ev.After = "", "", "", nil
			a.recordRevealAttempt(ctx, ev, audit.OutcomeDenied, "permission")
			return echo.NewHTTPError(http.StatusForbidden)
		}
		return perr
	}
	refuse := func(status int, code, msg string) error {
		a.recordRevealAttempt(ctx, ev, audit.OutcomeDenied, code)
		return render(c, status, views.Revealed(views.RevealData{Problem: msg}))
	}
	switch {
	case !a.mayReveal(c):
		a.recordRevealAttempt(ctx, ev, audit.OutcomeDenied, "permission")
		return echo.NewHTTPError(http.StatusForbidden)
	case a.kr == nil:
		return refuse(http.StatusServiceUnavailable, "no_keys", "This console holds no personal-data keys (PII_KEYS), so nothing can be revealed here.")
	case f.reason == "":
		return refuse(http.StatusForbidden, "no_reason", "Say why you need to see this value: a reveal needs a reason, and the reason is recorded.")
	case !a.reveals.Allow(sess.Issuer + "|" + sess.Subject):
		return refuse(http.StatusTooManyRequests, "rate_limited", fmt.Sprintf("At most %d reveals a minute: wait a moment.", RevealsPerMinute))
	}
	var value string
	err := db.WithTx(ctx, a.pool, func(tx pgx.Tx) error {
		v, err := a.openField(ctx, tx, f)
		if err != nil {
			return err
		}
		value = v
		ok := ev
		ok.Outcome = audit.OutcomeOK
		if v == pii.Undecryptable {
			ok.Outcome, ok.ErrorCode = audit.OutcomeError, "undecryptable"
		}
		return audit.Record(ctx, tx, ok)
	})
	switch {
	case err == nil:
		a.metrics.actions.WithLabelValues("pii.reveal", "ok").Inc()
		return render(c, http.StatusOK, views.Revealed(views.RevealData{Value: value}))
	case errors.Is(err, outbox.ErrNotFound), errors.Is(err, payments.ErrNotFound), errors.Is(err, errNoSuchField):
		a.recordRevealAttempt(ctx, ev, audit.OutcomeError, "not_found")
		return render(c, http.StatusNotFound, views.Revealed(views.RevealData{Problem: "This record has no such field."}))
	default:
		a.recordRevealAttempt(ctx, ev, audit.OutcomeError, "error")
		return err
	}
}

var errNoSuchField = errors.New("no such field")

// openField reads the one field: a sealed value is opened (a missing key
// gives pii.Undecryptable), a clear one is returned as stored.
func (a *App) openField(ctx context.Context, tx pgx.Tx, f revealForm) (string, error) {
	if f.targetType == auditTargetPayment {
		p, err := payments.Get(ctx, tx, f.id)
		if err != nil {
			return "", err
		}
		env, ok := p.Customer[f.field]
		if !ok {
			return "", errNoSuchField
		}
		v, err := a.kr.Open(payments.CustomerPlace(f.id), f.field, env)
		if err != nil {
			return pii.Undecryptable, nil
		}
		return v, nil
	}
	e, err := outbox.Get(ctx, tx, f.id)
	if err != nil {
		return "", err
	}
	raw, err := pii.OpenPayloadField(a.kr, e.EventType, e.ID.String(), e.Payload, f.field)
	switch {
	case errors.Is(err, pii.ErrUnknownKey), errors.Is(err, pii.ErrMalformed):
		return pii.Undecryptable, nil
	case err != nil:
		return "", errNoSuchField
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return text, nil
	}
	return string(raw), nil // a number or an object: its JSON
}

// mayReveal reports whether the signed-in user holds one of the roles that
// may reveal (CONSOLE_REVEAL_ROLES). The route is open to every signed-in
// user so the configured roles decide, not the fixed permission table.
func (a *App) mayReveal(c echo.Context) bool {
	s := auth.SessionFrom(c)
	if s == nil {
		return false
	}
	for _, r := range s.Roles {
		if slices.Contains(a.cfg.RevealRoles, r) {
			return true
		}
	}
	return false
}

// revealedField is the audit row's after: which field was shown, never
// its value.
func revealedField(field string) []byte {
	return []byte(fmt.Sprintf(`{"field":%q}`, field))
}

// recordRevealAttempt audits a refused or failed reveal in its own
// transaction and counts it.
func (a *App) recordRevealAttempt(ctx context.Context, ev audit.Event, outcome, code string) {
	a.metrics.actions.WithLabelValues(ev.Action, code).Inc()
	ev.Outcome, ev.ErrorCode = outcome, code
	actx := context.WithoutCancel(ctx)
	if err := db.WithTx(actx, a.pool, func(tx pgx.Tx) error { return audit.Record(actx, tx, ev) }); err != nil {
		a.log.Error("audit of a refused reveal failed", "target", ev.TargetID, "code", code, "err", err)
	}
}
