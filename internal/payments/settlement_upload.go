package payments

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
)

// SettlementUpload is a settlement file kept for its confirmation.
type SettlementUpload struct {
	SHA256 string
	Body   []byte
	// Uploaders are the staff ids (iss|sub) of the operators who uploaded
	// the file, and so read its dry run, within SettlementUploadTTL of
	// their own upload, earliest first: the ones who may apply it.
	Uploaders  []string
	UploadedAt time.Time // the latest upload
	AppliedAt  *time.Time
}

// SettlementUploadTTL is how long an uploaded file waits for its
// confirmation, counted for each uploader from their own upload; older
// ones are refused and deleted by the next upload.
const SettlementUploadTTL = time.Hour

// KeepSettlementUpload stores an uploaded file (already parsed whole) under
// its sha256 for the confirmation, adds by to the operators who uploaded
// it (or renews by's upload), and deletes uploads and uploaders past their
// TTL, applied or not. The same bytes uploaded again keep one row, and
// each uploader one row of their own: a second operator checking the same
// file does not take it from the first (a drill refused the first
// uploader's confirmation that way). A file uploaded again after its TTL
// starts a fresh set, as its row was deleted first.
func KeepSettlementUpload(ctx context.Context, pool db.Beginner, sha string, body []byte, by string) error {
	return db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		ttl := SettlementUploadTTL.Microseconds()
		// The uploaders of a deleted upload go with it (ON DELETE CASCADE).
		if _, err := tx.Exec(ctx, `DELETE FROM payment_settlement_upload WHERE uploaded_at < statement_timestamp() - $1::bigint * interval '1 microsecond'`, ttl); err != nil {
			return fmt.Errorf("payments: prune settlement uploads: %w", err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM payment_settlement_uploader WHERE uploaded_at < statement_timestamp() - $1::bigint * interval '1 microsecond'`, ttl); err != nil {
			return fmt.Errorf("payments: prune settlement uploaders: %w", err)
		}
		// uploaded_by is kept as the latest uploader for a binary from
		// before migration 00037 (a rolling upgrade); the set is
		// payment_settlement_uploader.
		if _, err := tx.Exec(ctx, `INSERT INTO payment_settlement_upload (sha256, body, uploaded_by) VALUES ($1, $2, $3)
			ON CONFLICT (sha256) DO UPDATE SET uploaded_at = statement_timestamp(), uploaded_by = EXCLUDED.uploaded_by`, sha, body, by); err != nil {
			return fmt.Errorf("payments: keep settlement upload: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO payment_settlement_uploader (sha256, uploaded_by, uploaded_at) VALUES ($1, $2, statement_timestamp())
			ON CONFLICT (sha256, uploaded_by) DO UPDATE SET uploaded_at = EXCLUDED.uploaded_at`, sha, by); err != nil {
			return fmt.Errorf("payments: keep settlement uploader: %w", err)
		}
		return nil
	})
}

// SettlementUploadOf reads a kept upload that is still within its TTL
// (ErrNotFound otherwise), with the uploaders still within theirs. The
// upload row's own uploaded_by counts too: it is the latest uploader, at
// the row's uploaded_at, and the only one an upload written by a binary
// from before migration 00037 names.
func SettlementUploadOf(ctx context.Context, q db.RowQuerier, sha string) (SettlementUpload, error) {
	var u SettlementUpload
	err := q.QueryRow(ctx, `
		WITH cutoff AS (SELECT statement_timestamp() - $2::bigint * interval '1 microsecond' AS at)
		SELECT u.sha256, u.body, u.uploaded_at, u.applied_at,
		       ARRAY(SELECT who FROM (
		                 SELECT r.uploaded_by AS who, r.uploaded_at AS at FROM payment_settlement_uploader r
		                  WHERE r.sha256 = u.sha256 AND r.uploaded_at >= (SELECT at FROM cutoff)
		                 UNION ALL
		                 SELECT u.uploaded_by, u.uploaded_at) w
		             GROUP BY who ORDER BY min(at), who)
		  FROM payment_settlement_upload u
		 WHERE u.sha256 = $1 AND u.uploaded_at >= (SELECT at FROM cutoff)`, sha, SettlementUploadTTL.Microseconds()).
		Scan(&u.SHA256, &u.Body, &u.UploadedAt, &u.AppliedAt, &u.Uploaders)
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
