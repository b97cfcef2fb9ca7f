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

// AuditSettledLine is a SettlementOptions.OnLine body: each payment a line
// settled (LineResolved) or asked a second operator about (LineAwaiting,
// as payments.resolve_request) gets an audit row in the line's own
// transaction, naming the file's sha256 and line and the actor (base's actor fields:
// the operator, or the OS user of the command line). Other lines change no
// payment and write nothing.
func AuditSettledLine(ctx context.Context, tx pgx.Tx, base audit.Event, l SettlementLine) error {
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
