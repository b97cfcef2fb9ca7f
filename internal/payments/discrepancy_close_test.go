package payments

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// completedPayments makes n payments the provider charged (completed, a
// ledger debit each) on account 1.
func (e *env) completedPayments(prefix string, n int) []uuid.UUID {
	e.t.Helper()
	ops := make([]uuid.UUID, n)
	for i := range ops {
		a := e.post(newKey(), payBody(fmt.Sprintf("%s-%d", prefix, i), 1, "100"))
		if a.status != 201 {
			e.t.Fatalf("payment %d: %d %s", i, a.status, a.body)
		}
		ops[i] = opOf(e.t, a)
	}
	return ops
}

// failedLines is a settlement file saying every op failed (a discrepancy
// for each completed one); head makes files of the same lines differ.
func failedLines(head string, ops ...uuid.UUID) string {
	var b strings.Builder
	b.WriteString("# " + head + "\n")
	for _, op := range ops {
		b.WriteString(op.String() + ",failed,prv-" + op.String()[:8] + "\n")
	}
	return b.String()
}

// closeIn closes a discrepancy in a transaction of its own on pool.
func closeIn(pool *pgxpool.Pool, c DiscrepancyClose) (Discrepancy, error) {
	ctx := context.Background()
	var d Discrepancy
	err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		var err error
		d, err = CloseDiscrepancy(ctx, tx, c)
		return err
	})
	return d, err
}

// untouched is everything a close must leave as it was: the payment's
// row, its reservation, the account, the ledger and the outbox.
func (e *env) untouched(op uuid.UUID) string {
	e.t.Helper()
	return fmt.Sprintf("%s updated=%s events=%d", e.books(op), e.payment(op).UpdatedAt, e.count(`SELECT count(*) FROM outbox_event`))
}

// A close records who closed the discrepancy and why and changes nothing
// else (status, reservation, account, ledger, outbox); it needs a reason
// and the discrepancy's own payment; a second close is ErrDiscrepancyClosed
// naming the first closer. Applying the same file again does not open it
// again (the operator's close stands); another file saying the same is new
// evidence and opens a new one; the payment keeps both in its history.
func TestCloseDiscrepancyRecordsWhoAndWhyAndNothingElse(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	ctx := context.Background()
	app := dbtest.AppRole(t, e.pool) // the console's role closes
	op := e.completedPayments("inv-c", 1)[0]
	file := failedLines("day 1", op)
	lines, _, err := e.settle(file, false)
	if err != nil || len(lines) != 1 || lines[0].Result != LineDiscrepancy || lines[0].Discrepancy != DiscrepancyOpened || lines[0].Status != StatusCompleted {
		t.Fatalf("settle: %+v %v", lines, err)
	}
	open, err := ListOpenDiscrepancies(ctx, e.pool, 10)
	if err != nil || len(open) != 1 || open[0].ID != lines[0].DiscrepancyID || open[0].Amount.StringFixed(2) != "100.00" || open[0].Currency != "TRY" {
		t.Fatalf("open: %+v %v", open, err)
	}
	id := open[0].ID
	before := e.untouched(op)

	for _, c := range []struct {
		name string
		c    DiscrepancyClose
		want error
	}{
		{"no reason", DiscrepancyClose{ID: id, OperationID: op, ClosedBy: "iss|alice", Reason: "  "}, ErrNoResolution},
		{"another payment's", DiscrepancyClose{ID: id, OperationID: uuid.New(), ClosedBy: "iss|alice", Reason: "refunded"}, ErrNotFound},
		{"no such discrepancy", DiscrepancyClose{ID: id + 1000, OperationID: op, ClosedBy: "iss|alice", Reason: "refunded"}, ErrNotFound},
	} {
		if _, err := closeIn(app, c.c); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if n, _ := CountOpenDiscrepancies(ctx, e.pool); n != 1 {
		t.Fatalf("a refused close closed it: %d open", n)
	}

	d, err := closeIn(app, DiscrepancyClose{ID: id, OperationID: op, ClosedBy: "iss|alice", CloserName: "Alice", Reason: "refunded the customer, ticket R-1"})
	if err != nil {
		t.Fatal(err)
	}
	if d.Open() || d.ResolvedBy != "iss|alice" || d.ResolverName != "Alice" || d.Resolution != "refunded the customer, ticket R-1" || d.OperationID != op {
		t.Fatalf("closed: %+v", d)
	}
	again, err := closeIn(app, DiscrepancyClose{ID: id, OperationID: op, ClosedBy: "iss|bob", CloserName: "Bob", Reason: "provider corrected its file"})
	if !errors.Is(err, ErrDiscrepancyClosed) || again.ResolvedBy != "iss|alice" || again.Resolution != "refunded the customer, ticket R-1" || again.ResolvedAt == nil {
		t.Fatalf("second close: %+v %v, want ErrDiscrepancyClosed naming Alice's close", again, err)
	}
	if after := e.untouched(op); after != before {
		t.Fatalf("closing changed the payment, its books or the outbox:\n before %s\n after  %s", before, after)
	}
	if n, _ := CountOpenDiscrepancies(ctx, e.pool); n != 0 {
		t.Fatalf("%d open after the close", n)
	}
	if err := e.svc.RefreshGauges(ctx); err != nil {
		t.Fatal(err)
	}
	if g := e.gauge("sluice_payments_discrepancies"); g != 0 {
		t.Fatalf("sluice_payments_discrepancies = %v after the close", g)
	}

	// The same file again: the operator's close stands.
	lines, _, err = e.settle(file, false)
	if err != nil || lines[0].Result != LineDiscrepancy || lines[0].Discrepancy != DiscrepancyClosed || lines[0].DiscrepancyID != id ||
		!strings.Contains(lines[0].Message, "closed by an operator") {
		t.Fatalf("the same file again: %+v %v", lines, err)
	}
	if dry, _, err := e.settle(file, true); err != nil || dry[0].Discrepancy != DiscrepancyClosed {
		t.Fatalf("its dry run: %+v %v", dry, err)
	}
	if n, _ := CountOpenDiscrepancies(ctx, e.pool); n != 0 {
		t.Fatalf("the same file opened the closed discrepancy again: %d open", n)
	}
	// Another file saying the same is new evidence.
	lines, _, err = e.settle(failedLines("day 2", op), false)
	if err != nil || lines[0].Discrepancy != DiscrepancyOpened || lines[0].DiscrepancyID == id {
		t.Fatalf("another file: %+v %v", lines, err)
	}
	all, err := DiscrepanciesOf(ctx, e.pool, op)
	if err != nil || len(all) != 2 || !all[0].Open() || all[1].ID != id || all[1].Open() {
		t.Fatalf("the payment's discrepancies, newest first: %+v %v", all, err)
	}
	if after := e.untouched(op); after != before {
		t.Fatalf("the files changed the payment, its books or the outbox:\n before %s\n after  %s", before, after)
	}
	e.checkBooks(1)
}

// Operators closing one discrepancy at once: exactly one close wins; each
// other gets ErrDiscrepancyClosed naming the winner, and the row keeps the
// winner's reason.
func TestConcurrentDiscrepancyClosesOneWins(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	app := dbtest.AppRole(t, e.pool)
	op := e.completedPayments("inv-cc", 1)[0]
	lines, _, err := e.settle(failedLines("day 1", op), false)
	if err != nil || lines[0].DiscrepancyID == 0 {
		t.Fatalf("settle: %+v %v", lines, err)
	}
	id := lines[0].DiscrepancyID
	before := e.untouched(op)
	const n = 8
	errs := make([]error, n)
	got := make([]Discrepancy, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			got[i], errs[i] = closeIn(app, DiscrepancyClose{ID: id, OperationID: op, ClosedBy: fmt.Sprintf("iss|op%d", i),
				CloserName: fmt.Sprintf("op%d", i), Reason: fmt.Sprintf("refund by op%d", i)})
		}()
	}
	close(gate)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Fatalf("op%d and op%d both closed it", winner, i)
		case err == nil:
			winner = i
		case !errors.Is(err, ErrDiscrepancyClosed):
			t.Fatalf("op%d: %v", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("nobody closed it")
	}
	want := fmt.Sprintf("iss|op%d", winner)
	for i, d := range got {
		if d.ResolvedBy != want || d.Resolution != fmt.Sprintf("refund by op%d", winner) {
			t.Errorf("op%d was told %q closed it (%q), want %s", i, d.ResolvedBy, d.Resolution, want)
		}
	}
	if after := e.untouched(op); after != before {
		t.Fatalf("closing changed the payment, its books or the outbox:\n before %s\n after  %s", before, after)
	}
}

// The open list pages oldest first and the closed list newest close first,
// by keyset: every row once, in order, across pages; a cursor of the other
// list, or an altered one, is ErrInvalidCursor.
func TestDiscrepancyListsPageByKeyset(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	ctx := context.Background()
	ops := e.completedPayments("inv-l", 5)
	if _, _, err := e.settle(failedLines("day 1", ops...), false); err != nil {
		t.Fatal(err)
	}
	walk := func(closed bool) []Discrepancy {
		t.Helper()
		var all []Discrepancy
		after := ""
		for range 10 {
			page, err := ListDiscrepancies(ctx, e.pool, DiscrepancyPage{Closed: closed, Limit: 2, After: after})
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, page.Rows...)
			if page.Next == "" {
				return all
			}
			if len(page.Rows) != 2 {
				t.Fatalf("a page of %d rows with a next page", len(page.Rows))
			}
			after = page.Next
		}
		t.Fatal("the pages never end")
		return nil
	}
	open := walk(false)
	if len(open) != 5 {
		t.Fatalf("%d open rows, want 5", len(open))
	}
	for i, d := range open {
		// The file's lines, in order, detected at the ticking test clock.
		if d.OperationID != ops[i] || (i > 0 && !open[i-1].DetectedAt.Before(d.DetectedAt)) {
			t.Fatalf("open row %d is %s detected %s, want %s oldest first", i, d.OperationID, d.DetectedAt, ops[i])
		}
	}
	first, err := ListDiscrepancies(ctx, e.pool, DiscrepancyPage{Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{first.Next + "x", "AAAA", strings.Repeat("A", 24)} {
		if _, err := ListDiscrepancies(ctx, e.pool, DiscrepancyPage{Limit: 2, After: bad}); !errors.Is(err, ErrInvalidCursor) {
			t.Errorf("cursor %q: %v, want ErrInvalidCursor", bad, err)
		}
	}
	if _, err := ListDiscrepancies(ctx, e.pool, DiscrepancyPage{Closed: true, Limit: 2, After: first.Next}); !errors.Is(err, ErrInvalidCursor) {
		t.Errorf("the open list's cursor on the closed list: %v, want ErrInvalidCursor", err)
	}

	for _, i := range []int{3, 0, 4} {
		if _, err := closeIn(e.pool, DiscrepancyClose{ID: open[i].ID, OperationID: open[i].OperationID, ClosedBy: "iss|alice", Reason: fmt.Sprintf("refund %d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	closed := walk(true)
	if len(closed) != 3 {
		t.Fatalf("%d closed rows, want 3", len(closed))
	}
	want := append([]Discrepancy(nil), closed...)
	sort.SliceStable(want, func(i, j int) bool {
		a, b := want[i], want[j]
		if !a.ResolvedAt.Equal(*b.ResolvedAt) {
			return a.ResolvedAt.After(*b.ResolvedAt)
		}
		return a.ID > b.ID
	})
	for i := range want {
		if closed[i].ID != want[i].ID {
			t.Fatalf("closed list order %v, want newest close first", closed)
		}
	}
	if rest := walk(false); len(rest) != 2 || rest[0].ID != open[1].ID || rest[1].ID != open[2].ID {
		t.Fatalf("open after three closes: %+v", rest)
	}
}

// The discrepancies lists stay index walks on a large history: the open
// list on payment_discrepancy_open_idx, the closed list on
// payment_discrepancy_closed_idx, first page and deep page alike (no sort,
// no sequential scan of the discrepancies).
func TestDiscrepancyListPlansWalkIndexes(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	const rows = 50_000
	if _, err := pool.Exec(ctx, `INSERT INTO account (account_id, currency, balance) VALUES (1, 'TRY', 1000000000)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO payment (operation_id, merchant_id, invoice_id, account_id, amount, currency, status, created_at, updated_at)
		SELECT gen_random_uuid(), 'm', 'inv-' || g, 1, 10, 'TRY', 'completed', now() - g * interval '1 second', now()
		  FROM generate_series(1, $1) g`, rows); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO payment_discrepancy (operation_id, recorded_status, provider_outcome, source, evidence, detected_at,
		                                 resolved_at, resolved_by, resolution)
		SELECT operation_id, 'completed', 'failed', 'settlement', 'settlement sha256:x line 1', created_at,
		       CASE WHEN invoice_id LIKE '%0' THEN NULL ELSE created_at + interval '1 hour' END,
		       CASE WHEN invoice_id LIKE '%0' THEN NULL ELSE 'iss|alice' END,
		       CASE WHEN invoice_id LIKE '%0' THEN NULL ELSE 'refunded' END
		  FROM payment;
		ANALYZE payment; ANALYZE payment_discrepancy`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name          string
		closed, after bool
		index         string
	}{
		{"open, first page", false, false, "payment_discrepancy_open_idx"},
		{"open, deep page", false, true, "payment_discrepancy_open_idx"},
		{"closed, first page", true, false, "payment_discrepancy_closed_idx"},
		{"closed, deep page", true, true, "payment_discrepancy_closed_idx"},
	} {
		args := pgx.NamedArgs{"limit": 51}
		if c.after { // half way into the history
			args["c_at"], args["c_id"] = time.Now().Add(-rows/2*time.Second), int64(rows/2)
		}
		rs, err := pool.Query(ctx, "EXPLAIN "+discrepancyListSQL(c.closed, c.after), args)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		lines, err := pgx.CollectRows(rs, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(lines, "\n")
		if strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Sort") || !strings.Contains(plan, c.index) {
			t.Errorf("%s: the plan does not walk %s in the list's order:\n%s", c.name, c.index, plan)
		}
	}
}

// settleAudited applies a file as the command line does: each line's audit
// row in its transaction, by actor.
func (e *env) settleAudited(file string, dryRun bool) []SettlementLine {
	e.t.Helper()
	base := audit.Event{ActorIss: "cli", ActorSub: "ops@host", ActorName: "ops@host", ActorRoles: []string{"cli"}}
	var lines []SettlementLine
	_, err := ApplySettlement(context.Background(), e.pool, strings.NewReader(file), SettlementOptions{
		Source: "eod.csv", Now: e.clk.Now, DryRun: dryRun, Report: func(l SettlementLine) { lines = append(lines, l) },
		OnLine: func(ctx context.Context, tx pgx.Tx, l SettlementLine) error {
			return AuditSettledLine(ctx, tx, base, l)
		},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return lines
}

type auditedLine struct {
	action, target, evidence, before, after string
}

func (e *env) auditedLines() []auditedLine {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT action, target_id, evidence, coalesce(before::text, ''), coalesce(after::text, '')
		FROM audit_event WHERE action LIKE 'payments.settle%' ORDER BY seq`)
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (auditedLine, error) {
		var a auditedLine
		return a, r.Scan(&a.action, &a.target, &a.evidence, &a.before, &a.after)
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// A settlement file's lines that settle nothing but need someone are
// audited: a line contradicting a final payment as
// payments.settle_discrepancy (our status, the provider's word, the
// discrepancy opened), a line naming no payment of ours as
// payments.settle_not_found, each naming the file's hash and line and no
// customer data. A dry run writes nothing; applying the file again writes
// nothing more; the audit chain holds.
func TestSettlementAuditsDiscrepancyAndNotFoundLines(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	e.account(1, "5000")
	done := e.completedPayments("inv-a", 1)[0]
	stranger := uuid.New()
	file := fmt.Sprintf("operation_id,outcome,provider_ref\n%s,failed,prv-1\n%s,succeeded,prv-2\n", done, stranger)
	e.settleAudited(file, true)
	if got := e.auditedLines(); len(got) != 0 {
		t.Fatalf("a dry run wrote audit rows: %+v", got)
	}
	lines := e.settleAudited(file, false)
	if len(lines) != 2 || lines[0].Result != LineDiscrepancy || lines[1].Result != LineNotFound {
		t.Fatalf("lines %+v", lines)
	}
	sha := lines[0].FileSHA256
	got := e.auditedLines()
	if len(got) != 2 {
		t.Fatalf("audit rows %+v, want one per line", got)
	}
	disc, nf := got[0], got[1]
	if disc.action != ActionSettleDiscrepancy || disc.target != done.String() || disc.evidence != "settlement sha256:"+sha+" line 2" ||
		!strings.Contains(disc.before, `"status": "completed"`) || !strings.Contains(disc.after, `"status": "completed"`) ||
		!strings.Contains(disc.after, `"discrepancy": "opened"`) || !strings.Contains(disc.after, fmt.Sprintf(`"discrepancy_id": "%d"`, lines[0].DiscrepancyID)) ||
		!strings.Contains(disc.after, `"provider_says": "failed"`) || !strings.Contains(disc.after, `"provider_ref": "prv-1"`) {
		t.Errorf("discrepancy line's row: %+v", disc)
	}
	if nf.action != ActionSettleNotFound || nf.target != stranger.String() || nf.evidence != "settlement sha256:"+sha+" line 3" ||
		!strings.Contains(nf.after, `"result": "not_found"`) || !strings.Contains(nf.after, `"provider_says": "succeeded"`) {
		t.Errorf("not_found line's row: %+v", nf)
	}
	// No customer data: neither the customer's clear values nor the
	// invoice are in any row.
	for _, canary := range []string{"Ayşe", "ayse@example.com", "12345678901", "inv-a-0"} {
		if n := e.count(`SELECT count(*) FROM audit_event a WHERE strpos(a::text, $1) > 0`, canary); n != 0 {
			t.Errorf("%d audit rows carry %q", n, canary)
		}
	}

	e.settleAudited(file, false)
	if again := e.auditedLines(); len(again) != 2 {
		t.Fatalf("applying the file again wrote more rows: %+v", again)
	}
	res, err := audit.Verify(context.Background(), e.pool)
	if err != nil || !res.Intact() {
		t.Fatalf("audit chain: %+v %v", res, err)
	}
}

// Every settlement line's evidence ends with its file's hash and line, the
// form by which a closed discrepancy is found again, whatever the source:
// a path holding the bare hex (/srv/settle/<sha>.csv) used to lose it, and
// running the same file again reopened what an operator had closed.
func TestLineEvidenceAlwaysEndsWithTheFilesLine(t *testing.T) {
	const sha = "0f3c9a"
	for _, source := range []string{"console sha256:" + sha, "/srv/settle/" + sha + ".csv", "/srv/settle/eod.csv"} {
		if got := lineEvidence(source, sha, 7); !strings.HasSuffix(got, lineRef(sha, 7)) {
			t.Errorf("source %q: evidence %q does not end with %q", source, got, lineRef(sha, 7))
		}
	}
}
