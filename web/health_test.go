package web_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/testkit"
)

func TestMetricsComeFromTheSnapshot(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 100 * time.Millisecond})
	insertEvent(t, h, "ledger")
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	b.get(t, h.base+"/no/such/page?x=1", "text/html")
	var body string
	testkit.Eventually(t, "backlog gauge", func() (bool, error) {
		_, body = b.get(t, h.base+"/metrics", "")
		return strings.Contains(body, `sluice_outbox_backlog{topic="ledger"} 1`), nil
	})
	for _, want := range []string{
		"sluice_outbox_oldest_pending_age_seconds", "sluice_outbox_dead_letter 0", "sluice_payments_unknown 0",
		"sluice_payments_reconcile_age_seconds 0", "sluice_payments_discrepancies 0", "sluice_ws_clients 0",
		`sluice_console_actions_total{action="auth.login",outcome="ok"} 1`,
		`sluice_http_request_duration_seconds_count{code="200",method="GET",route="/"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	t.Log(grepLines(body, "sluice_http_request_duration_seconds_count"))
	if strings.Contains(body, `route="/no`) || strings.Contains(body, "sluice_session") {
		t.Error("unbounded or sensitive label")
	}
}

func TestReadyzRefusesAnOutOfDateSchema(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b := newBrowser(t)
	if resp, _ := b.get(t, h.base+"/readyz", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("readyz %d", resp.StatusCode)
	}
	if _, err := h.pool.Exec(context.Background(), `DELETE FROM goose_db_version WHERE version_id = (SELECT max(version_id) FROM goose_db_version)`); err != nil {
		t.Fatal(err)
	}
	if resp, _ := b.get(t, h.base+"/readyz", ""); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("readyz with an old schema: %d", resp.StatusCode)
	}
	if resp, _ := b.get(t, h.base+"/healthz", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz %d", resp.StatusCode)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
