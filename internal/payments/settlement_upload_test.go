package payments

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// A kept settlement file names every operator who uploaded it within the
// hour of their own upload: a second operator uploading the same bytes (to
// check the same file) no longer takes it from the first (a drill refused
// the first uploader's confirmation that way). Each uploader's hour is
// their own, and a file uploaded again after its hour starts a fresh set.
func TestSettlementUploadKeepsEveryUploader(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	sha, body := strings.Repeat("a", 64), []byte("x\n")
	uploaders := func() []string {
		t.Helper()
		u, err := SettlementUploadOf(ctx, pool, sha)
		if err != nil {
			t.Fatal(err)
		}
		return u.Uploaders
	}
	for _, by := range []string{"iss|a", "iss|a", "iss|b"} {
		if err := KeepSettlementUpload(ctx, pool, sha, body, by); err != nil {
			t.Fatal(err)
		}
	}
	if got := uploaders(); !slices.Equal(got, []string{"iss|a", "iss|b"}) {
		t.Fatalf("uploaders %q, want a then b, each once", got)
	}
	if err := MarkSettlementApplied(ctx, pool, sha); err != nil {
		t.Fatal(err)
	}

	// a uploaded it over an hour ago, b (the latest, on the file's row)
	// a minute ago: only b may apply it.
	if _, err := pool.Exec(ctx, `UPDATE payment_settlement_uploader SET uploaded_at = uploaded_at - CASE uploaded_by WHEN 'iss|a' THEN interval '61 minutes' ELSE interval '1 minute' END;
		UPDATE payment_settlement_upload SET uploaded_at = uploaded_at - interval '1 minute'`); err != nil {
		t.Fatal(err)
	}
	if got := uploaders(); !slices.Equal(got, []string{"iss|b"}) {
		t.Fatalf("uploaders %q, want b alone: a's hour is over", got)
	}

	// The whole file's hour is over: it is gone, and an upload of the same
	// bytes starts again with its uploader alone, not yet applied.
	if _, err := pool.Exec(ctx, `UPDATE payment_settlement_upload SET uploaded_at = uploaded_at - interval '2 hours';
		UPDATE payment_settlement_uploader SET uploaded_at = uploaded_at - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	if _, err := SettlementUploadOf(ctx, pool, sha); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an upload past its hour reads as %v, want ErrNotFound", err)
	}
	if err := KeepSettlementUpload(ctx, pool, sha, body, "iss|c"); err != nil {
		t.Fatal(err)
	}
	u, err := SettlementUploadOf(ctx, pool, sha)
	if err != nil || !slices.Equal(u.Uploaders, []string{"iss|c"}) || u.AppliedAt != nil {
		t.Fatalf("after a re-upload past the hour: uploaders %q, applied %v (%v); want c alone, not applied", u.Uploaders, u.AppliedAt, err)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payment_settlement_uploader`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("%d uploader rows kept (%v), want 1: the expired ones are pruned", rows, err)
	}
}
