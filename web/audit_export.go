package web

import (
	"bufio"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/db"
)

// Audit action and target of an export: the target id is the format, the
// row's after carries the filter.
const (
	actionAuditExport = "audit.export"
	targetAuditExport = "audit_export"
)

// exportFlushRows is how many rows are written between two flushes to the
// client: the response is streamed, never held.
const exportFlushRows = 1000

// exportColumns are the CSV header and the JSON lines' keys, in order.
var exportColumns = []string{"seq", "occurred_at", "actor_iss", "actor_sub", "actor_name", "actor_roles", "action",
	"target_type", "target_id", "before", "after", "reason", "evidence", "request_id", "session_hash", "ip",
	"user_agent", "outcome", "error_code", "prev_hash", "hash"}

// auditExport is GET /audit/export?format=csv|jsonl with the list's filter:
// every matching row up to the chain head when it starts, oldest first,
// streamed as it is read (audit.Export reads keyset batches), so memory
// stays that of one batch at any size. The export is audited, in its own
// transaction, before the first byte is sent.
func (a *App) auditExport(c echo.Context) error {
	f, err := parseAuditForm(c.QueryParams())
	if err != nil {
		return badRequest(auditProblem(err))
	}
	format := c.QueryParam("format")
	var contentType string
	switch format {
	case "csv":
		contentType = "text/csv; charset=utf-8"
	case "jsonl":
		contentType = "application/x-ndjson; charset=utf-8"
	default:
		return badRequest("The export format must be csv or jsonl.")
	}
	ctx := c.Request().Context()
	sess := auth.SessionFrom(c)
	ev := a.actorEvent(c, sess, actionAuditExport, targetAuditExport, format)
	ev.After, _ = json.Marshal(map[string]any{"format": format, "filter": f.filter}) // strings and times: cannot fail
	if err := db.WithTx(ctx, a.pool, func(tx pgx.Tx) error { return audit.Record(ctx, tx, ev) }); err != nil {
		return err
	}
	a.metrics.actions.WithLabelValues(actionAuditExport, audit.OutcomeOK).Inc()

	h := c.Response().Header()
	h.Set(echo.HeaderContentType, contentType)
	h.Set(echo.HeaderContentDisposition, `attachment; filename="sluice-audit-`+time.Now().UTC().Format("20060102T150405Z")+`.`+format+`"`)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	c.Response().WriteHeader(http.StatusOK)

	w := bufio.NewWriterSize(c.Response(), 64<<10)
	var (
		write func(*audit.Stored) error
		flush = w.Flush
	)
	if format == "csv" {
		cw := csv.NewWriter(w)
		record := make([]string, len(exportColumns))
		write = func(s *audit.Stored) error {
			exportCSVRecord(s, record)
			return cw.Write(record)
		}
		flush = func() error {
			if cw.Flush(); cw.Error() != nil {
				return cw.Error()
			}
			return w.Flush()
		}
		if err := cw.Write(exportColumns); err != nil {
			return a.exportAborted(c, err)
		}
	} else {
		enc := json.NewEncoder(w)
		write = func(s *audit.Stored) error { return enc.Encode(exportJSON(s)) }
	}
	var n int64
	_, err = audit.Export(ctx, a.pool, f.filter, func(s *audit.Stored) error {
		if err := write(s); err != nil {
			return err
		}
		if n++; n%exportFlushRows == 0 {
			if err := flush(); err != nil {
				return err
			}
			c.Response().Flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return a.exportAborted(c, err)
	}
	return nil
}

// exportAborted ends a streamed export that failed after its status was
// sent: the connection is cut, so the client sees a broken download rather
// than a file that looks complete.
func (a *App) exportAborted(c echo.Context, err error) error {
	a.log.Error("audit export aborted", "request_id", requestIDOf(c), "err", err)
	panic(http.ErrAbortHandler)
}

// exportCSVRecord fills record with s's cells, each made inert for
// spreadsheets (csvCell).
func exportCSVRecord(s *audit.Stored, record []string) {
	roles, _ := json.Marshal(s.ActorRoles) // strings: cannot fail
	cells := []string{strconv.FormatInt(s.Seq, 10), s.OccurredAt.UTC().Format(time.RFC3339Nano), s.ActorIss,
		s.ActorSub, s.ActorName, string(roles), s.Action, s.TargetType, s.TargetID, string(s.Before), string(s.After),
		s.Reason, s.Evidence, s.RequestID, s.SessionHash, s.IP, s.UserAgent, s.Outcome, s.ErrorCode,
		hex.EncodeToString(s.PrevHash), hex.EncodeToString(s.Hash)}
	for i, v := range cells {
		record[i] = csvCell(v)
	}
}

// csvCell neutralizes formula injection (OWASP CSV injection): a cell a
// spreadsheet would read as a formula (it begins with =, +, -, @, a tab or
// a carriage return) gets a leading apostrophe, so it shows as text.
func csvCell(v string) string {
	if v != "" && strings.ContainsRune("=+-@\t\r", rune(v[0])) {
		return "'" + v
	}
	return v
}

// exportRow is one JSON line of the export.
type exportRow struct {
	Seq         int64           `json:"seq"`
	OccurredAt  time.Time       `json:"occurred_at"`
	ActorIss    string          `json:"actor_iss"`
	ActorSub    string          `json:"actor_sub"`
	ActorName   string          `json:"actor_name"`
	ActorRoles  []string        `json:"actor_roles"`
	Action      string          `json:"action"`
	TargetType  string          `json:"target_type"`
	TargetID    string          `json:"target_id"`
	Before      json.RawMessage `json:"before"`
	After       json.RawMessage `json:"after"`
	Reason      string          `json:"reason"`
	Evidence    string          `json:"evidence"`
	RequestID   string          `json:"request_id"`
	SessionHash string          `json:"session_hash"`
	IP          string          `json:"ip"`
	UserAgent   string          `json:"user_agent"`
	Outcome     string          `json:"outcome"`
	ErrorCode   string          `json:"error_code"`
	PrevHash    string          `json:"prev_hash"`
	Hash        string          `json:"hash"`
}

func exportJSON(s *audit.Stored) exportRow {
	before, after := s.Before, s.After
	if len(before) == 0 {
		before = json.RawMessage("null")
	}
	if len(after) == 0 {
		after = json.RawMessage("null")
	}
	return exportRow{Seq: s.Seq, OccurredAt: s.OccurredAt.UTC(), ActorIss: s.ActorIss, ActorSub: s.ActorSub,
		ActorName: s.ActorName, ActorRoles: s.ActorRoles, Action: s.Action, TargetType: s.TargetType,
		TargetID: s.TargetID, Before: before, After: after, Reason: s.Reason, Evidence: s.Evidence,
		RequestID: s.RequestID, SessionHash: s.SessionHash, IP: s.IP, UserAgent: s.UserAgent, Outcome: s.Outcome,
		ErrorCode: s.ErrorCode, PrevHash: hex.EncodeToString(s.PrevHash), Hash: hex.EncodeToString(s.Hash)}
}
