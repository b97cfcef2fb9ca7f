package db_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/payments"
)

// Migration 00037 gives an upload kept before it its one uploader, so a dry
// run read before the upgrade can still be confirmed by whoever uploaded
// it; an upload written without an uploader row (a binary from before the
// migration, during a rolling upgrade) names its uploaded_by too.
func TestSettlementUploadMigration00037KeepsEarlierUploads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := db.Open(ctx, dbtest.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := db.MigrateTo(ctx, pool, 36); err != nil {
		t.Fatalf("migrate to 36: %v", err)
	}
	before, old := strings.Repeat("b", 64), strings.Repeat("c", 64)
	const insert = `INSERT INTO payment_settlement_upload (sha256, body, uploaded_by, uploaded_at) VALUES ($1, 'x', $2, now() - interval '10 minutes')`
	if _, err := pool.Exec(ctx, insert, before, "iss|a"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, insert, old, "iss|old"); err != nil {
		t.Fatal(err)
	}
	for sha, want := range map[string][]string{before: {"iss|a"}, old: {"iss|old"}} {
		u, err := payments.SettlementUploadOf(ctx, pool, sha)
		if err != nil || !slices.Equal(u.Uploaders, want) {
			t.Fatalf("%s…: uploaders %q (%v), want %q", sha[:4], u.Uploaders, err, want)
		}
	}
	if err := payments.KeepSettlementUpload(ctx, pool, before, []byte("x"), "iss|b"); err != nil {
		t.Fatal(err)
	}
	if u, err := payments.SettlementUploadOf(ctx, pool, before); err != nil || !slices.Equal(u.Uploaders, []string{"iss|a", "iss|b"}) {
		t.Fatalf("after a second upload: %q (%v), want a then b", u.Uploaders, err)
	}
}
