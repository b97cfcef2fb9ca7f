package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/views"
)

// maxSettlementUpload bounds a settlement file uploaded to the console.
const maxSettlementUpload = 5 << 20

// settlementBodyLimit is the upload route's body limit: the file plus the
// multipart envelope and the form's other fields.
const settlementBodyLimit = "6M"

// isSettlementUpload picks the one route whose body may exceed BodyLimit.
func isSettlementUpload(c echo.Context) bool {
	return c.Request().Method == http.MethodPost && c.Path() == "/payments/settlements"
}

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// settlementForm is GET /payments/settlements.
func (a *App) settlementForm(c echo.Context) error {
	d := a.settlementData()
	if a.loginTooOld(auth.SessionFrom(c)) {
		d.ReauthURL = paymentReauthURL(settlementsPath)
	}
	return render(c, http.StatusOK, views.SettlementPage(a.page(c, "Settlement file", "/payments"), d))
}

// settlementsPath is the settlement page's address.
const settlementsPath = "/payments/settlements"

// settlementData is the page's data before a file: the four-eyes
// threshold its text names.
func (a *App) settlementData() views.SettlementData {
	return views.SettlementData{FourEyesAbove: a.cfg.FourEyesAbove.StringFixed(2)}
}

// settlementFourEyes keeps the four-eyes rule for a file applied by sess:
// a line that would resolve a payment above the threshold becomes a
// request for a second operator, as a typed resolution does; otherwise a
// hand-written file would move any amount on one operator's word.
func (a *App) settlementFourEyes(sess *auth.Session) *payments.SettlementFourEyes {
	return &payments.SettlementFourEyes{Above: a.cfg.FourEyesAbove, RequestedBy: staffID(sess), RequesterName: sess.Name}
}

// settlementUpload is POST /payments/settlements. With a file: it is read
// whole and validated (ParseSettlement; a bad line changes nothing and is
// named), kept server-side under its sha256 (payment_settlement_upload,
// for an hour, with each operator who uploaded it) and its dry run is
// shown with a confirmation form that carries only the hash. With
// confirm_sha256, from one of those operators within an hour of their own
// upload: the kept bytes of that hash are applied, once per line
// (ApplySettlement), and each settled payment gets its audit row in its
// line's transaction naming the hash and the operator, who is the
// four-eyes requester of the lines above the threshold. Keeping the bytes
// means the confirmation applies exactly the file whose dry run the
// operator read, without uploading it again.
//
// Both need a recent sign-in, as a typed resolution does: applying settles
// unknown payments, and a dry run is its first step (asking then spares
// an upload made for nothing).
func (a *App) settlementUpload(c echo.Context) error {
	if sess := auth.SessionFrom(c); a.loginTooOld(sess) {
		return a.reauthFor(c, sess, "POST "+settlementsPath, settlementsPath)
	}
	if sha := c.FormValue("confirm_sha256"); sha != "" {
		return a.settlementApply(c, sha)
	}
	page := a.page(c, "Settlement file", "/payments")
	fh, err := c.FormFile("file")
	if err != nil {
		return render(c, http.StatusBadRequest, views.SettlementPage(page, views.SettlementData{Problem: "Choose a settlement file to check."}))
	}
	if fh.Size > maxSettlementUpload {
		return render(c, http.StatusRequestEntityTooLarge, views.SettlementPage(page, views.SettlementData{
			Problem: fmt.Sprintf("The file is larger than %d MB; split it, or apply it with `console payments reconcile --file`.", maxSettlementUpload>>20)}))
	}
	f, err := fh.Open()
	if err != nil {
		return err
	}
	defer f.Close()
	body, err := io.ReadAll(io.LimitReader(f, maxSettlementUpload+1))
	if err != nil {
		return err
	}
	if len(body) > maxSettlementUpload {
		return render(c, http.StatusRequestEntityTooLarge, views.SettlementPage(page, views.SettlementData{Problem: "The file is larger than 5 MB."}))
	}
	if d, bad := settlementProblem(payments.ParseSettlement(bytes.NewReader(body))); bad {
		return render(c, http.StatusUnprocessableEntity, views.SettlementPage(page, d))
	}
	ctx := c.Request().Context()
	d := a.settlementData()
	if _, err := payments.ApplySettlement(ctx, a.pool, bytes.NewReader(body), payments.SettlementOptions{
		DryRun: true, FourEyes: a.settlementFourEyes(auth.SessionFrom(c)),
		Report: func(l payments.SettlementLine) { d.Lines = append(d.Lines, l); d.SHA256 = l.FileSHA256 },
	}); err != nil {
		return err
	}
	if err := payments.KeepSettlementUpload(ctx, a.pool, d.SHA256, body, staffID(auth.SessionFrom(c))); err != nil {
		return err
	}
	return render(c, http.StatusOK, views.SettlementPage(page, d))
}

// settlementProblem turns a parse error into the page's problem (bad: the
// file was refused).
func settlementProblem(_ payments.SettlementFile, err error) (views.SettlementData, bool) {
	var serr *payments.SettlementError
	switch {
	case err == nil:
		return views.SettlementData{}, false
	case errors.As(err, &serr):
		return views.SettlementData{Problem: views.CountOf(int64(len(serr.Problems)), "invalid line", "invalid lines") + ": nothing was applied. Fix them and upload the file again.",
			Problems: serr.Problems}, true
	case errors.Is(err, payments.ErrEmptySettlement):
		return views.SettlementData{Problem: "The file has no settlement lines: nothing was applied."}, true
	}
	return views.SettlementData{Problem: "The file cannot be read as a settlement file: nothing was applied."}, true
}

// livePoker wakes the relays and the live pages after a line's commit.
type livePoker struct {
	a   *App
	ctx context.Context
}

func (p livePoker) Poke() { p.a.pokeLive(p.ctx) }

// uploadersJSON is a refused confirmation's after: who may apply the file.
func uploadersJSON(ids []string) json.RawMessage {
	b, _ := json.Marshal(struct {
		Uploaders []string `json:"uploaders"`
	}{ids}) // strings only: Marshal cannot fail
	return b
}

func (a *App) settlementApply(c echo.Context, sha string) error {
	page := a.page(c, "Settlement file", "/payments")
	if !sha256Hex.MatchString(sha) {
		return badRequest("The confirmation does not name a file (a sha256 in hex).")
	}
	ctx := c.Request().Context()
	up, err := payments.SettlementUploadOf(ctx, a.pool, sha)
	if errors.Is(err, payments.ErrNotFound) {
		return render(c, http.StatusConflict, views.SettlementPage(page, views.SettlementData{
			Problem: "That file's dry run has expired (or was never made here). Upload it again to see its dry run, then confirm."}))
	}
	if err != nil {
		return err
	}
	sess := auth.SessionFrom(c)
	base := a.actorEvent(c, sess, payments.ActionSettle, auditTargetPayment, "")
	if !slices.Contains(up.Uploaders, staffID(sess)) {
		// The one who applies a file is the four-eyes requester of its lines
		// above the threshold, and must have read its dry run: else the
		// operator who uploaded a file could have a colleague confirm it by
		// its hash alone and then approve its lines. Every operator who
		// uploaded it within the hour has read it, so any of them may apply
		// it. The row names them (staff ids, not PII), for whoever reads
		// the refusal.
		denied := base
		denied.Evidence = "settlement sha256:" + sha
		denied.After = uploadersJSON(up.Uploaders)
		if err := a.auditDenied(ctx, denied, "not_uploader"); err != nil {
			return err
		}
		return render(c, http.StatusForbidden, views.SettlementPage(page, views.SettlementData{
			Problem: "You have not uploaded this file here in the last hour: upload it yourself to read its dry run, then confirm. Nothing was applied."}))
	}
	d := a.settlementData()
	d.SHA256, d.Applied = sha, true
	_, err = payments.ApplySettlement(ctx, a.pool, bytes.NewReader(up.Body), payments.SettlementOptions{
		Source: "console sha256:" + sha, Topic: a.cfg.PaymentsTopic, Poker: livePoker{a, context.WithoutCancel(ctx)},
		FourEyes: a.settlementFourEyes(sess),
		Report:   func(l payments.SettlementLine) { d.Lines = append(d.Lines, l) },
		OnLine: func(ctx context.Context, tx pgx.Tx, l payments.SettlementLine) error {
			if l.FileSHA256 != sha { // the kept bytes are the confirmed file
				return fmt.Errorf("web: settlement bytes hash to %s, not the confirmed %s", l.FileSHA256, sha)
			}
			return payments.AuditSettledLine(ctx, tx, base, l)
		},
	})
	if err != nil {
		a.metrics.actions.WithLabelValues(payments.ActionSettle, "error").Inc()
		return err
	}
	if err := payments.MarkSettlementApplied(ctx, a.pool, sha); err != nil {
		return err
	}
	n, held, opened, open, notFound := 0, 0, 0, 0, 0
	for _, l := range d.Lines {
		switch {
		case l.Result == payments.LineResolved:
			n++
		case l.Result == payments.LineAwaiting && l.ApprovalID != 0:
			held++
		case l.Result == payments.LineDiscrepancy && l.Discrepancy == payments.DiscrepancyOpened:
			opened++
		case l.Result == payments.LineDiscrepancy && l.Discrepancy == payments.DiscrepancyOpen:
			open++
		case l.Result == payments.LineNotFound:
			notFound++
		}
	}
	a.metrics.actions.WithLabelValues(payments.ActionSettle, audit.OutcomeOK).Add(float64(n))
	a.metrics.actions.WithLabelValues(payments.ActionResolveRequest, audit.OutcomeOK).Add(float64(held))
	a.metrics.actions.WithLabelValues(payments.ActionSettleDiscrepancy, audit.OutcomeOK).Add(float64(opened + open))
	a.metrics.actions.WithLabelValues(payments.ActionSettleNotFound, audit.OutcomeOK).Add(float64(notFound))
	d.Notice = "Applied: " + views.CountOf(int64(n), "unknown payment", "unknown payments") + " settled, each with its audit row naming this file's hash."
	if held > 0 {
		d.Notice += " " + views.CountOf(int64(held), "request", "requests") + " above the four-eyes threshold now " +
			views.Plural(int64(held), "waits", "wait") + " for a second operator on Approvals."
	}
	if opened+open > 0 {
		d.Notice += " " + views.CountOf(int64(opened+open), "line contradicts", "lines contradict") + " a final payment (" +
			views.Count(int64(opened)) + " new " + views.Plural(int64(opened), "discrepancy", "discrepancies") +
			"): nothing was changed; they wait under Discrepancies for an operator to correct the money and close them."
		d.Discrepancies = a.links.Discrepancies
	}
	if notFound > 0 {
		d.Notice += " " + views.CountOf(int64(notFound), "line names", "lines name") + " no payment of ours: recorded in the audit trail (" +
			payments.ActionSettleNotFound + "), for someone to take up with the provider."
	}
	if opened > 0 {
		a.feed.Poke() // the dashboard's count
	}
	return render(c, http.StatusOK, views.SettlementPage(page, d))
}
