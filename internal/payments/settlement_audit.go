package payments

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/audit"
)

// ActionSettle is the audit action of a payment settled by a settlement
// file line, from the console or `console payments reconcile`.
const ActionSettle = "payments.settle"

// ActionResolveRequest is the audit action of a four-eyes request: typed
// on a payment's page, or a settlement file's line above the threshold.
const ActionResolveRequest = "payments.resolve_request"

// Audit actions of the settlement lines that settle nothing but are
// evidence an operator must act on: a line contradicting a final payment
// (a discrepancy), and a line naming an operation id we have no payment
// for (money moved at the provider without a payment of ours, when it
// says succeeded).
const (
	ActionSettleDiscrepancy = "payments.settle_discrepancy"
	ActionSettleNotFound    = "payments.settle_not_found"
)

// settlementLineLock is the namespace of the advisory lock that makes a
// settlement line's evidence audited once (auditEvidenceLine).
const settlementLineLock int32 = 0x5E771E

// AuditSettledLine is a SettlementOptions.OnLine body: each payment a line
// settled (LineResolved) or asked a second operator about (LineAwaiting,
// as payments.resolve_request) gets an audit row in the line's own
// transaction, naming the file's sha256 and line and the actor (base's actor fields:
// the operator, or the OS user of the command line). A line contradicting
// a final payment (LineDiscrepancy, payments.settle_discrepancy) or naming
// no payment of ours (LineNotFound, payments.settle_not_found) changes no
// payment but is evidence someone must act on: it gets its row the first
// time the file is applied (auditEvidenceLine). Other lines (agreed,
// processing) write nothing.
func AuditSettledLine(ctx context.Context, tx pgx.Tx, base audit.Event, l SettlementLine) error {
	if l.Result == LineDiscrepancy || l.Result == LineNotFound {
		return auditEvidenceLine(ctx, tx, base, l)
	}
	if l.Result == LineAwaiting && l.ApprovalID != 0 {
		// A line held for a second operator is a four-eyes request by
		// whoever applied the file, audited as a typed one is.
		ev := base
		ev.Action, ev.TargetType, ev.TargetID, ev.Outcome = ActionResolveRequest, AggregateType, l.OperationID, audit.OutcomeOK
		ev.Evidence = fmt.Sprintf("settlement sha256:%s line %d", l.FileSHA256, l.Line)
		ev.Reason = lineReason(SettlementEntry{Outcome: l.Outcome, Line: l.Line})
		ev.Before, _ = json.Marshal(map[string]string{"status": string(StatusUnknown)})
		ev.After, _ = json.Marshal(map[string]string{"status": string(StatusUnknown), "outcome": string(l.Outcome),
			"approval": ApprovalPending, "approval_id": strconv.FormatInt(l.ApprovalID, 10), "sha256": l.FileSHA256})
		if err := audit.Record(ctx, tx, ev); err != nil {
			return fmt.Errorf("payments: audit settlement line %d: %w", l.Line, err)
		}
		return nil
	}
	if l.Result != LineResolved {
		return nil
	}
	ev := base
	ev.Action, ev.TargetType, ev.TargetID, ev.Outcome = ActionSettle, AggregateType, l.OperationID, audit.OutcomeOK
	ev.Evidence = fmt.Sprintf("settlement sha256:%s line %d", l.FileSHA256, l.Line)
	ev.Before, _ = json.Marshal(map[string]string{"status": string(StatusUnknown)})
	ev.After, _ = json.Marshal(map[string]string{"status": string(statusOf(l.Outcome)), "outcome": string(l.Outcome), "sha256": l.FileSHA256})
	if err := audit.Record(ctx, tx, ev); err != nil {
		return fmt.Errorf("payments: audit settlement line %d: %w", l.Line, err)
	}
	return nil
}

// auditEvidenceLine writes the audit row of a discrepancy or not_found
// line: the file's sha256 and line as evidence, what the provider says
// and its reference, and for a discrepancy our status and what became of
// the discrepancy (opened, already open, closed by an operator and not
// opened again). No customer data: ids, statuses and the provider's
// reference only. Once per file and line, as a resolved line (which reads
// "agreed" the second time) is: applying the same file again writes
// nothing more; another file saying the same is new evidence and is
// recorded. The advisory lock serializes two applies of one line, so the
// check and the row are one.
func auditEvidenceLine(ctx context.Context, tx pgx.Tx, base audit.Event, l SettlementLine) error {
	ev := base
	ev.TargetType, ev.TargetID, ev.Outcome = AggregateType, l.OperationID, audit.OutcomeOK
	ev.Evidence = fmt.Sprintf("settlement %s", lineRef(l.FileSHA256, l.Line))
	after := map[string]string{"result": l.Result, "provider_says": string(l.Outcome), "sha256": l.FileSHA256}
	if l.ProviderRef != "" {
		after["provider_ref"] = l.ProviderRef
	}
	if l.Result == LineNotFound {
		ev.Action = ActionSettleNotFound
	} else {
		ev.Action = ActionSettleDiscrepancy
		ev.Before, _ = json.Marshal(map[string]string{"status": string(l.Status)})
		after["status"] = string(l.Status) // never changed by the line
		after["discrepancy"] = l.Discrepancy
		if l.DiscrepancyID != 0 {
			after["discrepancy_id"] = strconv.FormatInt(l.DiscrepancyID, 10)
		}
	}
	ev.After, _ = json.Marshal(after)
	// The lock first, in a statement of its own: the check's snapshot must
	// be taken after it, to see a row the other apply committed meanwhile.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, settlementLineLock, ev.Evidence); err != nil {
		return fmt.Errorf("payments: audit settlement line %d: %w", l.Line, err)
	}
	var seen bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM audit_event WHERE target_type = $1 AND target_id = $2 AND action = $3 AND evidence = $4)`,
		ev.TargetType, ev.TargetID, ev.Action, ev.Evidence).Scan(&seen)
	if err != nil {
		return fmt.Errorf("payments: audit settlement line %d: %w", l.Line, err)
	}
	if seen {
		return nil
	}
	if err := audit.Record(ctx, tx, ev); err != nil {
		return fmt.Errorf("payments: audit settlement line %d: %w", l.Line, err)
	}
	return nil
}
