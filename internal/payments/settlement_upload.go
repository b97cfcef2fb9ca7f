package payments

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/internal/db"
)

// SettlementUpload is a settlement file kept for its confirmation.
type SettlementUpload struct {
	SHA256     string
	Body       []byte
	UploadedBy string
	UploadedAt time.Time
	AppliedAt  *time.Time
}

// SettlementUploadTTL is how long an uploaded file waits for its
// confirmation; older ones are refused and deleted by the next upload.
const SettlementUploadTTL = time.Hour

// KeepSettlementUpload stores an uploaded file (already parsed whole) under
// its sha256 for the confirmation, and deletes uploads past their TTL that
// were never applied. The same bytes uploaded again keep one row.
func KeepSettlementUpload(ctx context.Context, q db.Querier, sha string, body []byte, by string) error {
	if _, err := q.Exec(ctx, `DELETE FROM payment_settlement_upload WHERE uploaded_at < statement_timestamp() - $1::bigint * interval '1 microsecond'`,
		SettlementUploadTTL.Microseconds()); err != nil {
		return fmt.Errorf("payments: prune settlement uploads: %w", err)
	}
	if _, err := q.Exec(ctx, `INSERT INTO payment_settlement_upload (sha256, body, uploaded_by) VALUES ($1, $2, $3)
		ON CONFLICT (sha256) DO UPDATE SET uploaded_at = statement_timestamp(), uploaded_by = EXCLUDED.uploaded_by`, sha, body, by); err != nil {
		return fmt.Errorf("payments: keep settlement upload: %w", err)
	}
	return nil
}

// SettlementUploadOf reads a kept upload that is still within its TTL
// (ErrNotFound otherwise).
func SettlementUploadOf(ctx context.Context, q db.RowQuerier, sha string) (SettlementUpload, error) {
	var u SettlementUpload
	err := q.QueryRow(ctx, `SELECT sha256, body, uploaded_by, uploaded_at, applied_at FROM payment_settlement_upload
		WHERE sha256 = $1 AND uploaded_at >= statement_timestamp() - $2::bigint * interval '1 microsecond'`, sha, SettlementUploadTTL.Microseconds()).
		Scan(&u.SHA256, &u.Body, &u.UploadedBy, &u.UploadedAt, &u.AppliedAt)
	if err != nil {
		return SettlementUpload{}, notFound(err)
	}
	return u, nil
}

// MarkSettlementApplied records that a kept upload was applied.
func MarkSettlementApplied(ctx context.Context, q db.Querier, sha string) error {
	if _, err := q.Exec(ctx, `UPDATE payment_settlement_upload SET applied_at = statement_timestamp() WHERE sha256 = $1`, sha); err != nil {
		return fmt.Errorf("payments: mark settlement %s applied: %w", sha, err)
	}
	return nil
}
