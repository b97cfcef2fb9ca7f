package db_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// A uuid.UUID parameter goes through the binary wrapper, not its Valuer's
// string, and arrives as the same id: alone, in an array, and as NULL
// through a nil pointer, on a pool opened by db.OpenConfig.
func TestUUIDsAreSentBinary(t *testing.T) {
	t.Parallel()
	m := pgtype.NewMap()
	if p := m.PlanEncode(pgtype.UUIDOID, pgtype.BinaryFormatCode, uuid.New()); p == nil {
		t.Fatal("no plan for uuid.UUID")
	} else if _, ok := p.(*db.WrapUUIDPlan); ok {
		t.Fatal("a fresh type map already uses the wrapper: the test would prove nothing")
	}
	m = pgtype.NewMap() // a map memoizes its plans: register on a fresh one, as a connection does
	db.RegisterTypes(m)
	if p := m.PlanEncode(pgtype.UUIDOID, pgtype.BinaryFormatCode, uuid.New()); p == nil {
		t.Fatal("no plan for uuid.UUID")
	} else if _, ok := p.(*db.WrapUUIDPlan); !ok {
		t.Fatalf("uuid.UUID is encoded by %T, not the binary wrapper", p)
	}

	pool := dbtest.New(t)
	ctx := context.Background()
	id, ids := uuid.New(), []uuid.UUID{uuid.New(), uuid.New()}
	var (
		text string
		back []uuid.UUID
		null *string
	)
	if err := pool.QueryRow(ctx, `SELECT $1::uuid::text, $2::uuid[], $3::uuid::text`, id, ids, (*uuid.UUID)(nil)).Scan(&text, &back, &null); err != nil {
		t.Fatal(err)
	}
	if text != id.String() || len(back) != 2 || back[0] != ids[0] || back[1] != ids[1] || null != nil {
		t.Fatalf("sent %s %v nil, read %s %v %v", id, ids, text, back, null)
	}
}
