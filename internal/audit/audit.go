// Package audit is the append-only, hash-chained trail of everything staff do
// in the console (and everything they were refused). Each row's hash covers
// the previous row's hash and the row's own canonical bytes, so an edited,
// deleted or reordered row breaks the chain and Verify names it.
package audit

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Outcomes of an audited attempt.
const (
	OutcomeOK     = "ok"
	OutcomeDenied = "denied"
	OutcomeError  = "error"
)

// Event is one audited attempt. Before and After must already be masked:
// the trail never carries clear PII.
type Event struct {
	ActorIss    string
	ActorSub    string
	ActorName   string
	ActorRoles  []string
	Action      string // e.g. "auth.login", "request.denied", "outbox.retry"
	TargetType  string
	TargetID    string
	Before      json.RawMessage
	After       json.RawMessage
	Reason      string
	Evidence    string
	RequestID   string
	SessionHash string // hex sha256 of the session id, never the id
	IP          string
	UserAgent   string
	Outcome     string // OutcomeOK, OutcomeDenied or OutcomeError
	ErrorCode   string
}

// ErrInvalidEvent reports an event that cannot be recorded.
var ErrInvalidEvent = errors.New("audit: invalid event")

// chainLockKey serializes appends (pg_advisory_xact_lock): two transactions
// never read the same chain head, so the chain never forks.
const chainLockKey int64 = 0x511CEA0D17

// genesis is the prev_hash of the first row.
var genesis = make([]byte, sha256.Size)

// Record appends ev in the caller's transaction tx: the audit row exists if
// and only if tx commits, so an action and its audit event are one. Appends
// are serialized until tx ends. tx must be READ COMMITTED (pgx's default).
func Record(ctx context.Context, tx pgx.Tx, ev Event) error {
	switch ev.Outcome {
	case OutcomeOK, OutcomeDenied, OutcomeError:
	default:
		return fmt.Errorf("%w: outcome %q", ErrInvalidEvent, ev.Outcome)
	}
	if ev.Action == "" {
		return fmt.Errorf("%w: no action", ErrInvalidEvent)
	}
	ev = ev.sanitized()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, chainLockKey); err != nil {
		return fmt.Errorf("audit: lock chain: %w", err)
	}
	// The row's seq, database clock and normalized jsonb text are fixed
	// before the insert so the hash covers exactly what is stored.
	// The head is read after the lock, which only helps if the read takes a
	// fresh snapshot: under REPEATABLE READ or SERIALIZABLE the snapshot may
	// predate the previous append's commit, the head would be stale and the
	// chain would fork. Such transactions are refused (and roll back).
	var (
		r         row
		prevHash  []byte
		isolation string
	)
	err := tx.QueryRow(ctx, `
		SELECT nextval(pg_get_serial_sequence('audit_event', 'seq')),
		       clock_timestamp(),
		       $1::jsonb::text, $2::jsonb::text,
		       (SELECT hash FROM audit_event ORDER BY seq DESC LIMIT 1),
		       current_setting('transaction_isolation')`,
		nullJSON(ev.Before), nullJSON(ev.After)).Scan(&r.Seq, &r.OccurredAt, &r.Before, &r.After, &prevHash, &isolation)
	if err != nil {
		return fmt.Errorf("audit: chain head: %w", err)
	}
	if isolation != "read committed" {
		return fmt.Errorf("%w: appends need a READ COMMITTED transaction (got %s): an older snapshot would fork the chain", ErrInvalidEvent, isolation)
	}
	if prevHash == nil {
		prevHash = genesis
	}
	r.Event = ev
	r.OccurredAt = r.OccurredAt.Truncate(time.Microsecond)
	h := chainHash(prevHash, &r)
	_, err = tx.Exec(ctx, `
		INSERT INTO audit_event (seq, occurred_at, actor_iss, actor_sub, actor_name, actor_roles,
			action, target_type, target_id, before, after, reason, evidence, request_id,
			session_hash, ip, user_agent, outcome, error_code, prev_hash, hash)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, $11::jsonb, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)`,
		r.Seq, r.OccurredAt, ev.ActorIss, ev.ActorSub, ev.ActorName, ev.ActorRoles,
		ev.Action, ev.TargetType, ev.TargetID, r.Before, r.After, ev.Reason, ev.Evidence, ev.RequestID,
		ev.SessionHash, ev.IP, ev.UserAgent, ev.Outcome, ev.ErrorCode, prevHash, h)
	if err != nil {
		return fmt.Errorf("audit: append: %w", err)
	}
	return nil
}

// sanitized makes every text field storable: PostgreSQL refuses invalid
// UTF-8 and NUL in text, and several fields (user agent, route, ids) are
// attacker data. Without this a crafted User-Agent would make the insert
// fail, so a refusal would go unaudited. The hash covers the stored text.
func (ev Event) sanitized() Event {
	for _, f := range []*string{&ev.ActorIss, &ev.ActorSub, &ev.ActorName, &ev.Action, &ev.TargetType,
		&ev.TargetID, &ev.Reason, &ev.Evidence, &ev.RequestID, &ev.SessionHash, &ev.IP, &ev.UserAgent,
		&ev.Outcome, &ev.ErrorCode} {
		*f = storableText(*f)
	}
	roles := make([]string, len(ev.ActorRoles)) // a copy: the caller's slice stays untouched
	for i, r := range ev.ActorRoles {
		roles[i] = storableText(r)
	}
	ev.ActorRoles = roles
	return ev
}

func storableText(s string) string {
	if utf8.ValidString(s) && !strings.ContainsRune(s, 0) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

func nullJSON(b json.RawMessage) *string {
	if len(b) == 0 {
		return nil
	}
	s := string(b)
	return &s
}

// row is an audit_event row as the hash sees it.
type row struct {
	Event
	Seq        int64
	OccurredAt time.Time
	Before     *string // normalized jsonb text, nil for NULL
	After      *string
}

// canonical is the row's bytes for hashing: every field length-prefixed in a
// fixed order, so no two different rows share an encoding.
func canonical(r *row) []byte {
	var b bytes.Buffer
	num := func(n int64) {
		var buf [8]byte
		binary.BigEndian.PutUint64(buf[:], uint64(n))
		b.Write(buf[:])
	}
	str := func(s string) {
		num(int64(len(s)))
		b.WriteString(s)
	}
	optional := func(s *string) {
		if s == nil {
			num(-1)
			return
		}
		str(*s)
	}
	b.WriteString("sluice.audit.v1")
	num(r.Seq)
	num(r.OccurredAt.UnixMicro())
	str(r.ActorIss)
	str(r.ActorSub)
	str(r.ActorName)
	num(int64(len(r.ActorRoles)))
	for _, role := range r.ActorRoles {
		str(role)
	}
	str(r.Action)
	str(r.TargetType)
	str(r.TargetID)
	optional(r.Before)
	optional(r.After)
	str(r.Reason)
	str(r.Evidence)
	str(r.RequestID)
	str(r.SessionHash)
	str(r.IP)
	str(r.UserAgent)
	str(r.Outcome)
	str(r.ErrorCode)
	return b.Bytes()
}

// chainHash is sha256(prev_hash || canonical(row)).
func chainHash(prev []byte, r *row) []byte {
	h := sha256.New()
	h.Write(prev)
	h.Write(canonical(r))
	return h.Sum(nil)
}
