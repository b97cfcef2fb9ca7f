package web_test

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// Issue 10 item 10: anonymous noise does not grow the audit chain. Two
// thousand cross-site POSTs and anonymous POSTs from one address add no
// chain row and at most auth.RefusalsPerIP refusal-log rows (the console's
// clock stands still, so one rate window covers them all), while the
// metric counts every one.
func TestAnonymousRefusalsDoNotGrowTheChain(t *testing.T) {
	t.Parallel()
	clock := testkit.NewClock(time.Now())
	h := start(t, options{clock: clock.Now})
	c := newBrowser(t).noRedirects()
	const crossSite, anonymous = 2000, 300
	for i := 0; i < crossSite+anonymous; i++ {
		path := "/logout" // the one POST route: anonymous, it is refused for want of a session
		if i%2 == 1 && i < crossSite {
			path = "/no/such/page" // cross-origin protection answers before the router
		}
		req, _ := http.NewRequest(http.MethodPost, h.base+path, strings.NewReader("csrf_token=forged"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if i < crossSite {
			req.Header.Set("Sec-Fetch-Site", "cross-site")
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("POST %s #%d: %d, want 403", path, i, resp.StatusCode)
		}
	}
	if n := h.countAudit(t, `true`); n != 0 {
		t.Fatalf("anonymous refusals added %d chain rows", n)
	}
	if n := h.countRefusals(t, `true`); n < 1 || n > auth.RefusalsPerIP {
		t.Fatalf("%d refusal-log rows, want 1..%d", n, auth.RefusalsPerIP)
	}
	if n := h.countRefusals(t, `strpos(console_refusal::text, 'forged') > 0 OR route LIKE '%/no/such%'`); n != 0 {
		t.Fatalf("%d refusal-log rows carry the request's token or raw path", n)
	}
	_, body := newBrowser(t).get(t, h.base+"/metrics", "")
	for _, want := range []string{
		`sluice_console_refusals_total{reason="cross_origin"} 2000`,
		`sluice_console_refusals_total{reason="no_session"} 300`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q:\n%s", want, grepLines(body, "sluice_console_refusals"))
		}
	}
}

// A signed-in user's refusals enter the chain one by one up to
// auth.DeniedPerMinute a minute, then one more, which keeps its reason and
// says the later ones have no row, and the rest of the minute's are
// refused without a row each: a viewer
// sending refused requests in a loop grew the chain and queued operators'
// actions behind its appends (a security review).
func TestASessionsRefusalsInTheChainAreBounded(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	b, token := h.signedIn(t, "support")
	path := "/outbox/00000000-0000-7000-8000-000000000001/retry" // an operator's action
	for i := range auth.DeniedPerMinute + 20 {
		resp, _ := h.postForm(t, b, path, url.Values{"csrf_token": {token}, "expected": {"dead"}})
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("refusal %d: %d, want 403 every time", i+1, resp.StatusCode)
		}
	}
	if n := h.countAudit(t, `action = 'request.denied' AND error_code = 'permission'`); n != auth.DeniedPerMinute+1 {
		t.Errorf("%d refusals audited one by one, want %d", n, auth.DeniedPerMinute+1)
	}
	// The last one keeps its own reason and says the later ones have no row.
	if n := h.countAudit(t, `action = 'request.denied' AND error_code = 'permission' AND after->>'note' LIKE '%without an audit row each'`); n != 1 {
		t.Errorf("%d rows saying the later refusals are not recorded, want 1", n)
	}
	other, otherToken := h.signedIn(t, "auditor")
	if resp, _ := h.postForm(t, other, path, url.Values{"csrf_token": {otherToken}, "expected": {"dead"}}); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("another session's refusal: %d", resp.StatusCode)
	}
	if n := h.countAudit(t, `action = 'request.denied' AND error_code = 'permission' AND actor_name = 'auditor'`); n != 1 {
		t.Errorf("another session's refusal audited %d times, want 1", n)
	}
}
