package payments

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/db"

	"github.com/sluice-dev/sluice/internal/payments/provider"
)

// unknownPayments makes one unknown payment per invoice (the provider
// charges and never answers), all at once so the timeouts overlap.
func (e *env) unknownPayments(invoices ...string) []uuid.UUID {
	e.t.Helper()
	e.sim.SetInquiry(provider.InquiryUnknown)
	for range invoices {
		e.sim.Next(provider.BehaveTimeoutAfterCharge)
	}
	ops := make([]uuid.UUID, len(invoices))
	var wg sync.WaitGroup
	for i, inv := range invoices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := e.post(newKey(), payBody(inv, 1, "100"))
			if a.status != 202 {
				e.t.Errorf("%s: %d %s, want 202 unknown", inv, a.status, a.body)
				return
			}
			ops[i] = opOf(e.t, a)
		}()
	}
	wg.Wait()
	if e.t.Failed() {
		e.t.FailNow()
	}
	return ops
}

// dbState is everything a settlement file may change, as text, so a test
// can assert that nothing changed.
func (e *env) dbState() string {
	e.t.Helper()
	var out strings.Builder
	for _, q := range []string{
		`SELECT string_agg(concat_ws(' ', operation_id, status, provider_ref, failure_code, resolved_by, inquiry_attempts, next_inquiry_at, updated_at), E'\n' ORDER BY operation_id) FROM payment`,
		`SELECT string_agg(concat_ws(' ', operation_id, status, updated_at), E'\n' ORDER BY operation_id) FROM balance_reservation`,
		`SELECT string_agg(concat_ws(' ', account_id, balance, reserved), E'\n' ORDER BY account_id) FROM account`,
		`SELECT string_agg(concat_ws(' ', entry_id, operation_id, entry_type, amount), E'\n' ORDER BY entry_id) FROM ledger_entry`,
		`SELECT string_agg(concat_ws(' ', operation_id, status, response_status), E'\n' ORDER BY operation_id) FROM idempotency_record`,
		`SELECT count(*)::text FROM outbox_event`,
		`SELECT count(*)::text FROM payment_discrepancy`,
	} {
		var s *string
		if err := e.pool.QueryRow(context.Background(), q).Scan(&s); err != nil {
			e.t.Fatalf("%s: %v", q, err)
		}
		if s != nil {
			out.WriteString(*s)
		}
		out.WriteString("\n--\n")
	}
	return out.String()
}

func (e *env) settle(file string, dryRun bool) ([]SettlementLine, SettlementSummary, error) {
	e.t.Helper()
	var lines []SettlementLine
	sum, err := ApplySettlement(context.Background(), e.pool, strings.NewReader(file), SettlementOptions{
		Source: "eod.csv", Now: e.clk.Now, DryRun: dryRun, Report: func(l SettlementLine) { lines = append(lines, l) }})
	return lines, sum, err
}

func results(lines []SettlementLine) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l.Result
	}
	return out
}

// The file of issue 7: an unterminated quote on line 2 of 3 used to apply
// line 1, swallow line 3 and report "2 line(s)". Now the file is refused
// whole, the error names line 2 (and only line 2: line 3 is read on its
// own), and nothing changes. The same file fixed applies each line once;
// applying it again changes nothing.
func TestSettlementReadWholeOrNotAtAll(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{providerTimeout: shortTimeout})
	e.account(1, "5000")
	u := e.unknownPayments("inv-q1", "inv-q2", "inv-q3")
	before := e.dbState()

	bad := fmt.Sprintf("%s,succeeded,ref-1\n\"%s,failed\n%s,succeeded,ref-3\n", u[0], u[1], u[2])
	lines, _, err := e.settle(bad, false)
	var serr *SettlementError
	if !errors.As(err, &serr) || !errors.Is(err, ErrInvalidSettlement) {
		t.Fatalf("bad quote: err = %v, want a *SettlementError", err)
	}
	if len(serr.Problems) != 1 || serr.Problems[0].Line != 2 || !strings.Contains(err.Error(), "line 2:") {
		t.Fatalf("bad quote: problems %+v (%v), want exactly line 2", serr.Problems, err)
	}
	if len(lines) != 0 {
		t.Fatalf("a rejected file reported applied lines: %+v", lines)
	}
	if after := e.dbState(); after != before {
		t.Fatalf("a rejected file changed the database:\nbefore\n%s\nafter\n%s", before, after)
	}

	fixed := fmt.Sprintf("%s,succeeded,ref-1\n%s,failed\n%s,succeeded,ref-3\n", u[0], u[1], u[2])
	lines, sum, err := e.settle(fixed, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(results(lines), ","); got != "resolved,resolved,resolved" || sum[LineResolved] != 3 {
		t.Fatalf("fixed file: %s %v", got, sum)
	}
	if p := e.payment(u[0]); p.Status != StatusCompleted || p.ProviderRef != "ref-1" || p.ResolvedBy != "settlement:eod.csv" {
		t.Fatalf("line 1: %+v", p)
	}
	if p := e.payment(u[1]); p.Status != StatusFailed || e.reservation(u[1]) != ReservationReleased {
		t.Fatalf("line 2: %s / %s", p.Status, e.reservation(u[1]))
	}
	if e.payment(u[2]).Status != StatusCompleted || debits(e, 1) != 2 {
		t.Fatalf("line 3: %s, %d debits", e.payment(u[2]).Status, debits(e, 1))
	}
	once := e.dbState()
	lines, _, err = e.settle(fixed, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(results(lines), ","); got != "agreed,agreed,agreed" {
		t.Fatalf("second application: %s", got)
	}
	if again := e.dbState(); again != once {
		t.Fatalf("applying the file twice changed something:\nonce\n%s\ntwice\n%s", once, again)
	}
	e.checkBooks(1)
}

// Every invalid line is named; a BOM and CRLF line ends are accepted; a
// file without settlement lines is an error, never "0 lines, all fine".
func TestSettlementParse(t *testing.T) {
	t.Parallel()
	op1, op2 := uuid.New(), uuid.New()
	f, err := ParseSettlement(strings.NewReader("\xef\xbb\xbfoperation_id,outcome,provider_ref\r\n# a comment\r\n" + op1.String() + ",Succeeded,r1\r\n\r\n" + op2.String() + ",failed\r\n"))
	if err != nil {
		t.Fatalf("BOM + header + CRLF: %v", err)
	}
	if len(f.Entries) != 2 || f.Entries[0].OperationID != op1 || f.Entries[0].Line != 3 || f.Entries[0].ProviderRef != "r1" ||
		f.Entries[1].Outcome != OutcomeFailed || f.Entries[1].Line != 5 || len(f.SHA256) != 64 {
		t.Fatalf("entries %+v", f)
	}
	for _, empty := range []string{"", "\xef\xbb\xbf", "operation_id,outcome\n# nothing today\n\n"} {
		if _, err := ParseSettlement(strings.NewReader(empty)); !errors.Is(err, ErrEmptySettlement) {
			t.Errorf("%q: err = %v, want ErrEmptySettlement", empty, err)
		}
	}
	bad := strings.Join([]string{
		op1.String() + ",succeeded",
		"not-a-uuid,succeeded",
		op2.String() + ",maybe",
		op2.String(),
		op1.String() + ",failed", // contradicts line 1
		"\"unterminated," + op2.String() + ",failed",
		op2.String() + ",failed,\"ref\"x",
	}, "\n")
	_, err = ParseSettlement(strings.NewReader(bad))
	var serr *SettlementError
	if !errors.As(err, &serr) {
		t.Fatalf("err = %v", err)
	}
	var got []int
	for _, p := range serr.Problems {
		got = append(got, p.Line)
	}
	if fmt.Sprint(got) != "[2 3 4 5 6 7]" {
		t.Fatalf("problems on lines %v (%v), want 2..7", got, err)
	}
}

// --dry-run reports what the file would do — settle an unknown payment,
// contradict a failed one (discrepancy), agree with a completed one, name a
// charge we have no payment for — and changes nothing. Applying it for real
// then does exactly that, and the contradicted payment stays failed.
func TestSettlementDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{providerTimeout: shortTimeout})
	e.account(1, "5000")
	u := e.unknownPayments("inv-d1")[0]
	e.sim.Next(provider.BehaveDown)
	failed := opOf(t, e.post(newKey(), payBody("inv-d2", 1, "100")))
	done := opOf(t, e.post(newKey(), payBody("inv-d3", 1, "100")))
	stranger := uuid.New()
	file := fmt.Sprintf("operation_id,outcome,provider_ref\n%s,succeeded\n%s,succeeded,bank-7\n%s,succeeded\n%s,succeeded\n", u, failed, done, stranger)

	before := e.dbState()
	lines, sum, err := e.settle(file, true)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(results(lines), ","); got != "resolved,discrepancy,agreed,not_found" {
		t.Fatalf("dry run: %s %+v", got, lines)
	}
	if !strings.HasPrefix(lines[0].Message, "would ") || sum[LineNotFound] != 1 {
		t.Fatalf("dry run messages: %+v", lines)
	}
	if after := e.dbState(); after != before {
		t.Fatalf("--dry-run changed the database:\nbefore\n%s\nafter\n%s", before, after)
	}

	lines, _, err = e.settle(file, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(results(lines), ","); got != "resolved,discrepancy,agreed,not_found" {
		t.Fatalf("apply: %s", got)
	}
	if e.payment(u).Status != StatusCompleted {
		t.Fatal("the unknown payment was not settled")
	}
	if p := e.payment(failed); p.Status != StatusFailed || e.reservation(failed) != ReservationReleased {
		t.Fatalf("a machine flipped a failed payment: %s / %s", p.Status, e.reservation(failed))
	}
	ds, err := ListOpenDiscrepancies(context.Background(), e.pool, 10)
	if err != nil || len(ds) != 1 {
		t.Fatalf("open discrepancies %+v %v", ds, err)
	}
	d := ds[0]
	if d.OperationID != failed || d.Source != DiscrepancySettlement || d.RecordedStatus != StatusFailed || d.ProviderOutcome != OutcomeSucceeded ||
		d.ProviderRef != "bank-7" || !strings.Contains(d.Evidence, "line 3") || !strings.Contains(d.Evidence, "sha256:") {
		t.Fatalf("discrepancy %+v", d)
	}
	e.checkBooks(1)
}

// With the console's four-eyes rule (SettlementOptions.FourEyes), a line
// that would resolve a payment above the threshold records a request for a
// second operator instead: the payment stays unknown, the dry run says so,
// applying the file again asks nothing more, and the approval resolves the
// payment with the line's provider reference. The file alone never moves
// such an amount on one operator's word.
func TestSettlementAboveTheFourEyesThresholdWaitsForASecondOperator(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{providerTimeout: shortTimeout})
	e.account(1, "5000")
	u := e.unknownPayments("inv-h1", "inv-h2") // 100.00 each
	ctx := context.Background()
	fourEyes := &SettlementFourEyes{Above: decimal.RequireFromString("99.99"), RequestedBy: "iss|uploader", RequesterName: "uploader"}
	settle := func(dryRun bool) []SettlementLine {
		t.Helper()
		var lines []SettlementLine
		if _, err := ApplySettlement(ctx, e.pool, strings.NewReader(fmt.Sprintf("%s,succeeded,ref-1\n%s,failed\n", u[0], u[1])), SettlementOptions{
			Source: "console sha256:x", Now: e.clk.Now, DryRun: dryRun, FourEyes: fourEyes,
			Report: func(l SettlementLine) { lines = append(lines, l) }}); err != nil {
			t.Fatal(err)
		}
		return lines
	}
	before := e.dbState()
	for _, l := range settle(true) {
		if l.Result != LineAwaiting || !strings.Contains(l.Message, "would ask a second operator") {
			t.Fatalf("dry run: %+v", l)
		}
	}
	if e.dbState() != before {
		t.Fatal("the dry run changed the database")
	}
	lines := settle(false)
	for _, l := range lines {
		if l.Result != LineAwaiting || l.ApprovalID == 0 {
			t.Fatalf("applied: %+v, want a four-eyes request", l)
		}
	}
	for _, op := range u {
		if p := e.payment(op); p.Status != StatusUnknown {
			t.Fatalf("%s moved to %s without a second operator", op, p.Status)
		}
	}
	a, err := GetApproval(ctx, e.pool, lines[0].ApprovalID)
	if err != nil || a.State != ApprovalPending || a.RequestedBy != "iss|uploader" || a.Outcome != OutcomeSucceeded ||
		a.ProviderRef != "ref-1" || !strings.Contains(a.Evidence, "line 1") || !strings.Contains(a.Evidence, "ref-1") {
		t.Fatalf("the request: %+v %v", a, err)
	}
	for _, l := range settle(false) {
		if l.Result != LineAwaiting || l.ApprovalID != 0 {
			t.Fatalf("applied again: %+v, want the waiting request named, no new one", l)
		}
	}
	var n int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM payment_approval`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d requests after applying twice, want 2 (%v)", n, err)
	}

	decide := func(id int64, by string) (Payment, error) {
		var p Payment
		err := db.WithTx(ctx, e.pool, func(tx pgx.Tx) error {
			var err error
			_, p, err = Decide(ctx, tx, Decision{ID: id, Approve: true, DecidedBy: by, DeciderName: by})
			return err
		})
		return p, err
	}
	if _, err := decide(lines[0].ApprovalID, "iss|uploader"); !errors.Is(err, ErrSelfApproval) {
		t.Fatalf("the uploader approving their own file's request: %v, want ErrSelfApproval", err)
	}
	p, err := decide(lines[0].ApprovalID, "iss|second")
	if err != nil || p.Status != StatusCompleted || p.ProviderRef != "ref-1" || p.ResolvedBy != "operator:iss|uploader approved by iss|second" {
		t.Fatalf("approved: %+v %v", p, err)
	}

	// A file contradicting a request that waits says so (dry run and apply)
	// rather than "already waits": the approver would otherwise approve
	// what the provider denies.
	one := func(line string, dryRun bool) SettlementLine {
		t.Helper()
		var got []SettlementLine
		if _, err := ApplySettlement(ctx, e.pool, strings.NewReader(line), SettlementOptions{Source: "console sha256:y", Now: e.clk.Now,
			DryRun: dryRun, FourEyes: fourEyes, Report: func(l SettlementLine) { got = append(got, l) }}); err != nil || len(got) != 1 {
			t.Fatalf("%q: %v %+v", line, err, got)
		}
		return got[0]
	}
	for _, dry := range []bool{true, false} {
		if l := one(u[1].String()+",succeeded\n", dry); l.Result != LineAwaiting || !strings.Contains(l.Message, "but this file says succeeded") {
			t.Fatalf("contradicting the waiting request (dry run %v): %+v", dry, l)
		}
	}
	// Above the threshold, a payment that is no longer unknown is
	// classified, never resolved by the file: completed above, the file
	// saying failed is a discrepancy.
	if l := one(u[0].String()+",failed\n", false); l.Result != LineDiscrepancy {
		t.Fatalf("a completed payment above the threshold, the file saying failed: %+v", l)
	}
	if p := e.payment(u[0]); p.Status != StatusCompleted {
		t.Fatalf("the file moved a completed payment: %s", p.Status)
	}
	e.checkBooks(1)
}

// `console payments reconcile` applies every line, also one whose payment
// has a four-eyes request waiting: the dry run and the result say so, with
// the request's number, so the operator closes it (Approvals marks it too).
func TestSettlementNamesAWaitingRequest(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{providerTimeout: shortTimeout})
	e.account(1, "5000")
	u := e.unknownPayments("inv-w1")[0]
	var id int64
	if err := db.WithTx(context.Background(), e.pool, func(tx pgx.Tx) error {
		a, err := RequestResolve(context.Background(), tx, ApprovalRequest{OperationID: u, Outcome: OutcomeSucceeded,
			Reason: "provider ticket", Evidence: "T-1", RequestedBy: "iss|oncall", RequesterName: "oncall"})
		id = a.ID
		return err
	}); err != nil {
		t.Fatal(err)
	}
	file := fmt.Sprintf("%s,failed\n", u)
	want := fmt.Sprintf("four-eyes request #%d waits for it", id)
	for _, dry := range []bool{true, false} {
		lines, _, err := e.settle(file, dry)
		if err != nil {
			t.Fatal(err)
		}
		if len(lines) != 1 || lines[0].Result != LineResolved || !strings.Contains(lines[0].Message, want) {
			t.Fatalf("dry run %v: %+v, want the waiting request named", dry, lines)
		}
	}
	if p := e.payment(u); p.Status != StatusFailed {
		t.Fatalf("payment %s, want failed", p.Status)
	}
	e.checkBooks(1)
}
