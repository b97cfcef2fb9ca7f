package db

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// MigrateTo applies the migrations up to and including version, as a
// database made by an earlier release would have them.
func MigrateTo(ctx context.Context, pool *pgxpool.Pool, version int64) error {
	p, sqlDB, err := provider(pool)
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	_, err = p.UpTo(ctx, version)
	return err
}

// RegisterTypes is registerTypes, for the type map test.
var RegisterTypes = registerTypes

// WrapUUIDPlan is the binary uuid plan's type, for the type map test.
type WrapUUIDPlan = wrapUUIDPlan
