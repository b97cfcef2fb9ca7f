package web

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"

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
	return render(c, http.StatusOK, views.SettlementPage(a.page(c, "Settlement file", "/payments"), views.SettlementData{}))
}

// settlementUpload is POST /payments/settlements. With a file: it is read
// whole and validated (ParseSettlement; a bad line changes nothing and is
// named), kept server-side under its sha256 (payment_settlement_upload,
// for an hour) and its dry run is shown with a confirmation form that
// carries only the hash. With confirm_sha256: the kept bytes of that hash
// are applied, once per line (ApplySettlement), and each settled payment
// gets its audit row in its line's transaction naming the hash and the
// operator. Keeping the bytes means the confirmation applies exactly the
// file whose dry run the operator read, without uploading it again.
func (a *App) settlementUpload(c echo.Context) error {
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
	var d views.SettlementData
	if _, err := payments.ApplySettlement(ctx, a.pool, bytes.NewReader(body), payments.SettlementOptions{
		DryRun: true, Report: func(l payments.SettlementLine) { d.Lines = append(d.Lines, l); d.SHA256 = l.FileSHA256 },
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
		return views.SettlementData{Problem: fmt.Sprintf("%d invalid line(s): nothing was applied. Fix them and upload the file again.", len(serr.Problems)),
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
	d := views.SettlementData{SHA256: sha, Applied: true}
	_, err = payments.ApplySettlement(ctx, a.pool, bytes.NewReader(up.Body), payments.SettlementOptions{
		Source: "console sha256:" + sha, Topic: a.cfg.PaymentsTopic, Poker: livePoker{a, context.WithoutCancel(ctx)},
		Report: func(l payments.SettlementLine) { d.Lines = append(d.Lines, l) },
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
	n := 0
	for _, l := range d.Lines {
		if l.Result == payments.LineResolved {
			n++
		}
	}
	a.metrics.actions.WithLabelValues(payments.ActionSettle, audit.OutcomeOK).Add(float64(n))
	d.Notice = fmt.Sprintf("Applied: %d unknown payment(s) settled, each with its audit row naming this file's hash.", n)
	return render(c, http.StatusOK, views.SettlementPage(page, d))
}
