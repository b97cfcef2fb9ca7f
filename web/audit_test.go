package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/db"
)

// hostile is SECURITY.md case 6's text.
const hostile = `<script>alert(1)</script>" onmouseover="alert(2)" x=" hx-get="/logout" hx-trigger="load"`

// record appends audit events through the real chain (audit.Record) and
// returns their seqs.
func record(t *testing.T, h *harness, evs ...audit.Event) []int64 {
	t.Helper()
	ctx := context.Background()
	var seqs []int64
	for _, ev := range evs {
		if ev.Outcome == "" {
			ev.Outcome = audit.OutcomeOK
		}
		var seq int64
		err := db.WithTx(ctx, h.pool, func(tx pgx.Tx) error {
			if err := audit.Record(ctx, tx, ev); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT max(seq) FROM audit_event`).Scan(&seq)
		})
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, seq)
	}
	return seqs
}

func auditSeqs(d *goquery.Document) []int64 {
	var out []int64
	d.Find(`[data-testid="row"]`).Each(func(_ int, s *goquery.Selection) {
		n, _ := strconv.ParseInt(s.AttrOr("data-seq", ""), 10, 64)
		out = append(out, n)
	})
	return out
}

func TestAuditListFiltersPages(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	seqs := record(t, h,
		audit.Event{ActorIss: "https://idp", ActorSub: "sub-alice", ActorName: "Alice", Action: "outbox.retry",
			TargetType: "outbox_event", TargetID: "0190f3a2-7c1e-7d4b-9a51-1f2e3d4c5b6a", Reason: "stuck"},
		audit.Event{ActorIss: "https://idp", ActorSub: "sub-bob", ActorName: "Bob", Action: "outbox.discard",
			TargetType: "outbox_event", TargetID: "0190f3a2-7c1e-7d4b-9a51-1f2e3d4c5b6b", Reason: "duplicate"},
		audit.Event{ActorIss: "https://idp", ActorSub: "sub-bob", ActorName: "Bob", Action: "request.denied",
			TargetType: "route", TargetID: "POST /outbox/:id/retry", Outcome: audit.OutcomeDenied, ErrorCode: "permission"},
	)
	alice, bobDiscard, bobDenied := seqs[0], seqs[1], seqs[2]
	var paged []int64
	for i := range 120 {
		paged = append(paged, record(t, h, audit.Event{ActorSub: "sub-pager", Action: "test.page", TargetType: "thing", TargetID: strconv.Itoa(i)})...)
	}
	b, _ := h.signedIn(t, "auditor")
	get := func(q string) (int, *goquery.Document) {
		t.Helper()
		resp, body := b.get(t, h.base+"/audit"+q, "text/html")
		return resp.StatusCode, doc(t, body)
	}
	for q, want := range map[string][]int64{
		"?actor=Alice":                  {alice},
		"?actor=sub-alice":              {alice},
		"?actor=Bob":                    {bobDenied, bobDiscard},
		"?actor=Bob&outcome=ok":         {bobDiscard},
		"?outcome=denied&actor=sub-bob": {bobDenied},
		"?action=outbox.discard":        {bobDiscard},
		"?target_type=outbox_event&target_id=0190f3a2-7c1e-7d4b-9a51-1f2e3d4c5b6a": {alice},
		"?target_type=route&actor=Bob":                                             {bobDenied},
		"?action=test.page&target_type=thing&target_id=7":                          {paged[7]},
		"?actor=Bob&from=2000-01-01T00:00":                                         {bobDenied, bobDiscard},
		"?actor=Bob&to=2000-01-01T00:00":                                           nil,
		"?actor=Bob&from=2999-01-01T00:00":                                         nil,
	} {
		code, d := get(q)
		if code != 200 || !slices.Equal(auditSeqs(d), want) {
			t.Errorf("%s: %d %v, want %v", q, code, auditSeqs(d), want)
		}
	}
	// The filter stays in the form, and the count line names it.
	_, d := get("?actor=Bob&outcome=ok")
	if d.Find(`select[name="outcome"] option[selected]`).AttrOr("value", "") != "ok" || d.Find(`[data-testid="f-actor"]`).AttrOr("value", "") != "Bob" {
		t.Error("the form does not keep the filter")
	}
	if got := squashed(d.Find(`[data-testid="count"]`)); !strings.HasPrefix(got, `1 row matches actor "Bob"`) {
		t.Errorf("count line %q", got)
	}

	// A reason is what the person typed: in the error colour only on a
	// refused or failed row, whose outcome is marked too.
	_, d = get("?actor=Bob")
	row := func(seq int64) *goquery.Selection {
		return d.Find(fmt.Sprintf(`[data-testid="row"][data-seq="%d"]`, seq))
	}
	if ok := row(bobDiscard); ok.Find(`[data-testid="row-reason"]`).Text() != "duplicate" ||
		ok.Find(`.bad, .err`).Length() != 0 {
		t.Errorf("an ok row's reason looks like an error: %s", goquery.NodeName(ok.Find(`.bad, .err`)))
	}
	if denied := row(bobDenied); !denied.Find(`[data-testid="row-outcome"]`).HasClass("bad") {
		t.Error("a denied row's outcome is not marked")
	}

	// Keyset pages: 50, 50, 20, newest first, no repeats or gaps.
	var all []int64
	next := "?action=test.page"
	for pages := 0; next != ""; pages++ {
		if pages > 3 {
			t.Fatal("too many pages")
		}
		code, d := get(next)
		if code != 200 {
			t.Fatalf("page %d: %d", pages, code)
		}
		all = append(all, auditSeqs(d)...)
		next = ""
		if href, ok := d.Find(`[data-testid="next"]`).Attr("href"); ok {
			next = strings.TrimPrefix(href, "/audit")
		}
		if pages > 0 && d.Find(`[data-testid="first"]`).Length() != 1 {
			t.Error("no link to the first page")
		}
	}
	want := slices.Clone(paged)
	slices.Reverse(want)
	if !slices.Equal(all, want) {
		t.Fatalf("pages: %d rows %v, want %v", len(all), all, want)
	}

	// A cursor that is altered or belongs to another filter: 400, said.
	_, d = get("?action=test.page")
	cursor := d.Find(`[data-testid="next"]`).AttrOr("href", "")
	u, _ := url.Parse(cursor)
	after := u.Query().Get("after")
	for _, q := range []string{"?action=test.page&after=garbage", "?action=test.page&after=" + after[:len(after)-2] + "AA",
		"?action=outbox.retry&after=" + after, "?after=" + strings.Repeat("A", 100)} {
		if code, d := get(q); code != http.StatusBadRequest || d.Find(`[data-testid="problem"]`).Length() != 1 {
			t.Errorf("%s: %d, want 400 with the problem said", q, code)
		}
	}
	for _, q := range []string{"?outcome=maybe", "?target_id=x", "?from=yesterday", "?from=2025-01-02T00:00&to=2025-01-01T00:00"} {
		if code, d := get(q); code != http.StatusBadRequest || d.Find(`[data-testid="problem"]`).Length() != 1 {
			t.Errorf("%s: %d, want 400 with the problem said", q, code)
		}
	}
}

func TestAuditAccessByRole(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	seq := record(t, h, audit.Event{ActorSub: "s", Action: "test.access"})[0]
	paths := []string{"/audit", "/audit/" + strconv.FormatInt(seq, 10), "/audit/export?format=csv", "/audit/export?format=jsonl"}
	for _, user := range []string{"support", "oncall"} {
		b, token := h.signedIn(t, user)
		_, home := b.get(t, h.base+"/", "text/html")
		if doc(t, home).Find(`[data-testid="nav-audit"]`).Length() != 0 {
			t.Errorf("%s: the navigation links to the audit pages", user)
		}
		for _, p := range paths {
			if resp, _ := b.get(t, h.base+p, "text/html"); resp.StatusCode != http.StatusForbidden {
				t.Errorf("%s GET %s: %d, want 403", user, p, resp.StatusCode)
			}
		}
		if resp, _ := h.postForm(t, b, "/audit/verify", url.Values{"csrf_token": {token}}); resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s POST /audit/verify: %d, want 403", user, resp.StatusCode)
		}
		for _, route := range []string{"GET /audit", "GET /audit/:seq", "GET /audit/export", "POST /audit/verify"} {
			if n := h.countAudit(t, `action = 'request.denied' AND outcome = 'denied' AND actor_name = $1 AND target_id = $2`, user, route); n == 0 {
				t.Errorf("%s %s: the denial is not audited", user, route)
			}
		}
		// The row names the object as well as the route's template.
		if n := h.countAudit(t, `action = 'request.denied' AND actor_name = $1 AND target_id = 'GET /audit/:seq' AND after->>'path' = $2`, user,
			"/audit/"+strconv.FormatInt(seq, 10)); n != 1 {
			t.Errorf("%s: %d refusals of GET /audit/%d name its path, want 1", user, n, seq)
		}
	}
	if n := h.countAudit(t, `action = 'audit.export'`); n != 0 {
		t.Errorf("a refused export was recorded as an export (%d rows)", n)
	}
	for _, user := range []string{"auditor", "admin"} {
		b, _ := h.signedIn(t, user)
		_, home := b.get(t, h.base+"/", "text/html")
		if doc(t, home).Find(`[data-testid="nav-audit"]`).AttrOr("href", "") != "/audit" {
			t.Errorf("%s: no Audit in the navigation", user)
		}
		for _, p := range paths {
			if resp, _ := b.get(t, h.base+p, "text/html"); resp.StatusCode != http.StatusOK {
				t.Errorf("%s GET %s: %d, want 200", user, p, resp.StatusCode)
			}
		}
	}
	// Anonymous: the pages redirect to the sign-in, the export is 401.
	anon := newBrowser(t)
	if resp, _ := anon.noRedirects().Get(h.base + "/audit/export?format=csv"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("anonymous export: %d", resp.StatusCode)
	}
}

func TestAuditEntryLinksAndHostileText(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	ev := plant(t, h, planted{status: "dead"})
	paymentOp := uuid.Must(uuid.NewV7())
	before, _ := json.Marshal(map[string]any{"status": "dead", "note": hostile})
	after, _ := json.Marshal(map[string]any{"status": "pending"})
	seqs := record(t, h,
		audit.Event{ActorIss: "https://idp", ActorSub: "sub-x", ActorName: "Mallory " + hostile, ActorRoles: []string{"operator"},
			Action: "outbox.retry", TargetType: "outbox_event", TargetID: ev.String(), Before: before, After: after,
			Reason: "reason " + hostile, RequestID: "req-1", SessionHash: "abcd", IP: "192.0.2.7", UserAgent: "UA " + hostile},
		audit.Event{ActorSub: "sub-y", Action: "odd", TargetType: "outbox_event", TargetID: hostile, Reason: hostile},
		audit.Event{ActorSub: "sub-z", Action: "payments.resolve", TargetType: "payment", TargetID: "op-1"},
		audit.Event{ActorSub: "sub-z", Action: "payments.resolve", TargetType: "payment", TargetID: paymentOp.String()},
		audit.Event{ActorSub: "sub-z", Action: "auth.login", TargetType: "session"},
	)
	b, _ := h.signedIn(t, "auditor")
	for _, p := range []string{"/audit", "/audit?target_type=outbox_event&target_id=" + url.QueryEscape(hostile),
		"/audit/" + strconv.FormatInt(seqs[0], 10), "/audit/" + strconv.FormatInt(seqs[1], 10)} {
		resp, body := b.get(t, h.base+p, "text/html")
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", p, resp.StatusCode)
		}
		assertInert(t, p, body)
	}
	_, body := b.get(t, h.base+"/audit/"+strconv.FormatInt(seqs[0], 10), "text/html")
	d := doc(t, body)
	for id, want := range map[string]string{"actor": "Mallory " + hostile, "reason": "reason " + hostile, "user-agent": "UA " + hostile,
		"ip": "192.0.2.7", "request-id": "req-1", "session-hash": "abcd", "action": "outbox.retry"} {
		if got := d.Find(`[data-testid="` + id + `"]`).Text(); got != want {
			t.Errorf("%s: %q, want %q", id, got, want)
		}
	}
	if d.Find(`[hx-disable] [data-testid="before"]`).Length() != 1 || d.Find(`[hx-disable] [data-testid="after"]`).Length() != 1 {
		t.Error("before and after are not shown inside hx-disable")
	}
	if got := d.Find(`[data-testid="before"]`).Text(); !strings.Contains(got, `"status": "dead"`) || !strings.Contains(got, `<script>alert(1)</script>`) {
		t.Errorf("before is not the pretty JSON as stored: %q", got)
	}
	if len(d.Find(`[data-testid="hash"]`).Text()) != 64 || len(d.Find(`[data-testid="prev-hash"]`).Text()) != 64 {
		t.Error("the hashes are not shown")
	}
	if got := d.Find(`[data-testid="target-link"]`).AttrOr("href", ""); got != "/outbox/"+ev.String() {
		t.Errorf("target link %q", got)
	}
	history := d.Find(`[data-testid="history-link"]`).AttrOr("href", "")
	_, hb := b.get(t, h.base+history, "text/html")
	if got := auditSeqs(doc(t, hb)); !slices.Equal(got, []int64{seqs[0]}) {
		t.Errorf("history %s: %v", history, got)
	}
	// A target id that is no event id, and one that is no operation id:
	// no link to a page that is not there. A payment's row links to it.
	for _, seq := range seqs[1:3] {
		_, body := b.get(t, h.base+"/audit/"+strconv.FormatInt(seq, 10), "text/html")
		if n := doc(t, body).Find(`[data-testid="target-link"]`).Length(); n != 0 {
			t.Errorf("seq %d: a link to a target page that does not exist", seq)
		}
	}
	_, body = b.get(t, h.base+"/audit/"+strconv.FormatInt(seqs[3], 10), "text/html")
	if got := doc(t, body).Find(`[data-testid="target-link"]`).AttrOr("href", ""); got != "/payments/"+paymentOp.String() {
		t.Errorf("a payment's audit row links to %q, want its page", got)
	}
	// A target without id (a login's session) is named alone: no id to
	// copy, no history of "every session" passed off as its own.
	_, body = b.get(t, h.base+"/audit/"+strconv.FormatInt(seqs[4], 10), "text/html")
	d = doc(t, body)
	if got := strings.TrimSpace(d.Find(`[data-testid="target"]`).Text()); got != "session" || d.Find(`[data-testid="history-link"]`).Length() != 0 {
		t.Errorf("a target without id shown as %q (history link: %d)", got, d.Find(`[data-testid="history-link"]`).Length())
	}
	_, body = b.get(t, h.base+"/audit", "text/html")
	d = doc(t, body)
	if got := strings.Join(strings.Fields(d.Find(`[data-testid="exports"]`).Text()), " "); !strings.HasPrefix(got, "Export the whole trail: CSV · JSON lines") {
		t.Errorf("export line %q", got)
	}
	d.Find(`[data-testid="row"]`).Each(func(_ int, r *goquery.Selection) {
		if r.Find(`[data-testid="row-action"]`).Text() == "auth.login" {
			if got := strings.TrimSpace(r.Find(`[data-testid="row-target"]`).Text()); got != "session" {
				t.Errorf("a login's row target %q, want session", got)
			}
		}
	})
	if resp, _ := b.get(t, h.base+"/audit/999999", "text/html"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("missing row: %d", resp.StatusCode)
	}
	for _, p := range []string{"/audit/abc", "/audit/-1", "/audit/0", "/audit/99999999999999999999"} {
		if resp, _ := b.get(t, h.base+p, "text/html"); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", p, resp.StatusCode)
		}
	}

	// The event's page links its audit rows and its full history, for those
	// who may open them.
	_, body = b.get(t, h.base+"/outbox/"+ev.String(), "text/html")
	d = doc(t, body)
	if got := d.Find(`[data-testid="audit-row-link"]`).AttrOr("href", ""); got != "/audit/"+strconv.FormatInt(seqs[0], 10) {
		t.Errorf("audit row link %q", got)
	}
	if got := d.Find(`[data-testid="audit-history"]`).AttrOr("href", ""); got != history {
		t.Errorf("history link %q, want %q", got, history)
	}
	viewer, _ := h.signedIn(t, "support")
	_, body = viewer.get(t, h.base+"/outbox/"+ev.String(), "text/html")
	// A viewer may not see the audit trail (DESIGN.md's roles): no panel,
	// no rows, no links; the timeline keeps the event's own history.
	if d := doc(t, body); d.Find(`[data-testid="audit-row-link"], [data-testid="audit-history"], [data-testid="audit-row"]`).Length() != 0 {
		t.Error("a viewer sees the event's audit rows or links to the audit pages")
	}
}
