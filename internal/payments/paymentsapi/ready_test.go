package paymentsapi_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/sluice-dev/sluice/internal/db"
)

// /readyz tells a load balancer whether this instance can take payments: the
// database answers and carries the schema the binary ships.
func TestReadyzFollowsTheSchema(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	ready := func() int {
		resp, err := http.Get(e.srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := ready(); got != http.StatusOK {
		t.Fatalf("fresh database: /readyz = %d, want 200", got)
	}
	if _, err := e.pool.Exec(context.Background(), `DELETE FROM goose_db_version WHERE version_id = $1`, db.LatestVersion()); err != nil {
		t.Fatal(err)
	}
	if got := ready(); got != http.StatusServiceUnavailable {
		t.Fatalf("out-of-date schema: /readyz = %d, want 503", got)
	}
}
