package web_test

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// verification is the newest audit_verification row.
func verification(t *testing.T, h *harness) audit.Verification {
	t.Helper()
	v, ok, err := audit.LatestVerification(context.Background(), h.pool)
	if err != nil || !ok {
		t.Fatalf("no verification: %v", err)
	}
	return v
}

func TestAuditVerifyIntactThenBroken(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	ctx := context.Background()
	var seqs []int64
	for i := range 30 {
		seqs = append(seqs, record(t, h, audit.Event{ActorSub: "sub-v", Action: "test.verify", TargetID: strconv.Itoa(i)})...)
	}
	b, token := h.signedIn(t, "auditor")
	_, body := b.get(t, h.base+"/audit", "text/html")
	if got := doc(t, body).Find(`[data-testid="chain-status"]`).Text(); !strings.Contains(got, "not been verified") {
		t.Errorf("status before any verification: %q", got)
	}
	// CSRF: a POST without the token is refused and starts nothing.
	if resp, _ := h.postForm(t, b, "/audit/verify", url.Values{}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("verify without CSRF: %d", resp.StatusCode)
	}
	if n := h.countAudit(t, `action = 'audit.verify'`); n != 0 {
		t.Fatalf("a refused verify was started (%d rows)", n)
	}

	resp, _ := h.postForm(t, b, "/audit/verify", url.Values{"csrf_token": {token}})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/audit?verify=started" {
		t.Fatalf("verify: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	testkit.Eventually(t, "the verification ends", func() (bool, error) {
		return verification(t, h).Finished(), nil
	})
	v := verification(t, h)
	var head int64
	if err := h.pool.QueryRow(ctx, `SELECT seq FROM audit_event WHERE action = 'audit.verify'`).Scan(&head); err != nil {
		t.Fatal(err)
	}
	// The walk sees at least the row that started it (committed before it).
	if v.State != audit.VerificationIntact || v.HeadSeq == nil || *v.HeadSeq < head || v.FirstBrokenSeq != nil || v.RequestedBy != "auditor" {
		t.Fatalf("verification: %+v (head %d)", v, head)
	}
	if n := h.countAudit(t, `action = 'audit.verify' AND actor_name = 'auditor' AND outcome = 'ok' AND target_id = $1`, strconv.FormatInt(v.ID, 10)); n != 1 {
		t.Errorf("start audited %d times", n)
	}
	if n := h.countAudit(t, `action = 'audit.verify.intact' AND target_id = $1 AND (after->>'head_seq')::bigint = $2`, strconv.FormatInt(v.ID, 10), *v.HeadSeq); n != 1 {
		t.Errorf("result audited %d times", n)
	}
	_, body = b.get(t, h.base+"/audit?verify=started", "text/html")
	d := doc(t, body)
	if s := d.Find(`[data-testid="chain-status"]`); s.AttrOr("data-state", "") != "intact" || !strings.Contains(s.Text(), "seq "+strconv.FormatInt(*v.HeadSeq, 10)) {
		t.Errorf("status after an intact walk: %q", s.Text())
	}

	// The live socket of the audit pages carries the chain's state (the
	// page's own websocket URL), for auditors only.
	ws, err := h.dialPath(t, b, "/ws?page=audit")
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	testkit.Eventually(t, "the socket shows the intact chain", func() (bool, error) {
		frame, err := readFrames(ws, 1)
		return strings.Contains(frame, `id="audit-chain-state"`) && strings.Contains(frame, `data-state="intact"`), err
	})
	viewer, _ := h.signedIn(t, "support")
	if _, err := h.dialPath(t, viewer, "/ws?page=audit"); err == nil {
		t.Error("a viewer opened the audit pages' websocket")
	}

	// Edit a row as the table's owner (triggers off, as an intruder with
	// the owner's rights would): the next walk names it.
	tampered := seqs[11]
	if err := db.WithTx(ctx, h.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `ALTER TABLE audit_event DISABLE TRIGGER USER`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE audit_event SET reason = 'rewritten' WHERE seq = $1`, tampered); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `ALTER TABLE audit_event ENABLE TRIGGER USER`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	admin, adminToken := h.signedIn(t, "admin")
	if resp, _ := h.postForm(t, admin, "/audit/verify", url.Values{"csrf_token": {adminToken}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("admin verify: %d", resp.StatusCode)
	}
	testkit.Eventually(t, "the second verification ends", func() (bool, error) {
		v := verification(t, h)
		return v.ID != 0 && v.Finished() && v.RequestedBy == "admin", nil
	})
	v = verification(t, h)
	if v.State != audit.VerificationBroken || v.FirstBrokenSeq == nil || *v.FirstBrokenSeq != tampered || !strings.Contains(v.Problem, "edited") {
		t.Fatalf("after tampering: %+v", v)
	}
	testkit.Eventually(t, "the socket shows the broken chain", func() (bool, error) {
		frame, err := readFrames(ws, 1)
		return strings.Contains(frame, `data-state="broken"`) && strings.Contains(frame, "seq "+strconv.FormatInt(tampered, 10)), err
	})
	if n := h.countAudit(t, `action = 'audit.verify.broken' AND (after->>'first_broken_seq')::bigint = $1`, tampered); n != 1 {
		t.Errorf("broken result audited %d times", n)
	}
	for _, p := range []string{"/audit", "/audit/" + strconv.FormatInt(tampered, 10)} {
		_, body = b.get(t, h.base+p, "text/html")
		d = doc(t, body)
		if s := d.Find(`[data-testid="chain-status"]`); s.AttrOr("data-state", "") != "broken" ||
			d.Find(`[data-testid="chain-broken-seq"]`).AttrOr("href", "") != "/audit/"+strconv.FormatInt(tampered, 10) {
			t.Errorf("%s: status after tampering: %q", p, s.Text())
		}
	}
}

func TestAuditVerifyOneAtATime(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	ctx := context.Background()
	// A running verification of another console (fresh heartbeat): a new
	// request is a conflict, audited, and starts nothing.
	if _, err := h.pool.Exec(ctx, `INSERT INTO audit_verification (requested_by) VALUES ('elsewhere')`); err != nil {
		t.Fatal(err)
	}
	b, token := h.signedIn(t, "auditor")
	_, body := b.get(t, h.base+"/audit", "text/html")
	if d := doc(t, body); d.Find(`[data-testid="chain-running"]`).Length() != 1 {
		t.Error("a running verification is not shown")
	}
	resp, _ := h.postForm(t, b, "/audit/verify", url.Values{"csrf_token": {token}})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/audit?verify=running" {
		t.Fatalf("verify while one runs: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if n := h.countAudit(t, `action = 'audit.verify' AND outcome = 'error' AND error_code = 'running'`); n != 1 {
		t.Errorf("the refused request audited %d times", n)
	}
	// Its heartbeat stops (the other console died): the next request closes
	// it as failed and runs.
	if _, err := h.pool.Exec(ctx, `UPDATE audit_verification SET heartbeat_at = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	if resp, _ := h.postForm(t, b, "/audit/verify", url.Values{"csrf_token": {token}}); resp.Header.Get("Location") != "/audit?verify=started" {
		t.Fatalf("verify after the other was abandoned: %s", resp.Header.Get("Location"))
	}
	testkit.Eventually(t, "the verification ends", func() (bool, error) { return verification(t, h).Finished(), nil })
	var states string
	if err := h.pool.QueryRow(ctx, `SELECT string_agg(state, ',' ORDER BY id) FROM audit_verification`).Scan(&states); err != nil {
		t.Fatal(err)
	}
	if states != "failed,intact" {
		t.Errorf("verification states %q", states)
	}
	_, body = b.get(t, h.base+"/audit", "text/html")
	if doc(t, body).Find(`[data-testid="chain-status"]`).AttrOr("data-state", "") != "intact" {
		t.Error("the status does not show the intact walk")
	}
}
