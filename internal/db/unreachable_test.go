package db_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluice-dev/sluice/internal/db"
)

// A database that cannot be reached, or drops the connection, is told from
// a statement it refused.
func TestUnreachableTellsTheConnectionFromTheStatement(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, refused := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:1/none?connect_timeout=2")
	if refused == nil {
		t.Fatal("something answers on port 1")
	}
	for _, err := range []error{
		refused,
		fmt.Errorf("read session: %w", &pgconn.PgError{Code: "57P01"}),
		&pgconn.PgError{Code: "53300"},
		&pgconn.PgError{Code: "08006"},
	} {
		if !db.Unreachable(err) {
			t.Errorf("Unreachable(%v) = false", err)
		}
	}
	_, httpErr := http.Get("http://127.0.0.1:1/")
	for _, err := range []error{nil, &pgconn.PgError{Code: "23505"}, &pgconn.PgError{Code: "40001"}, pgx.ErrNoRows, context.Canceled, httpErr, io.EOF} {
		if db.Unreachable(err) {
			t.Errorf("Unreachable(%v) = true", err)
		}
	}
}
