package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/pii"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// The planted personal data: distinctive enough that any appearance in
// clear, anywhere, is the plant and not a coincidence.
const (
	canaryName  = "Zephyrine Canarywing"
	canaryEmail = "zephyrine.canary@plant.example"
	canaryTaxID = "98765432109"
	canaryPhone = "+90 555 000 9876"
)

// canaryNeedles are the forms a canary takes in clear: the name whole and
// each of its words, the email whole and its local part, the tax id's and
// the phone's digits, with and without the phone's spaces and country code.
var canaryNeedles = []string{
	strings.ToLower(canaryName), "zephyrine", "canarywing",
	strings.ToLower(canaryEmail), "zephyrine.canary", "canary@plant",
	canaryTaxID,
	canaryPhone, strings.ReplaceAll(canaryPhone, " ", ""), "905550009876", "5550009876", "555 000 9876",
}

// jsonEscapes undoes the escapes a JSON encoder may use for the canaries'
// characters, so an escaped value still counts as clear.
var jsonEscapes = strings.NewReplacer(`\u002b`, "+", `\u002B`, "+", `\u0040`, "@", `\u0026`, "&", `\u003c`, "<", `\u003e`, ">")

// leaks lists the canary forms s carries in clear (case-insensitive, after
// undoing HTML entities and JSON escapes).
func leaks(s string) []string {
	norm := strings.ToLower(html.UnescapeString(jsonEscapes.Replace(s)))
	var found []string
	for _, n := range canaryNeedles {
		if strings.Contains(norm, n) {
			found = append(found, n)
		}
	}
	return found
}

// SECURITY.md case 12, the whole system at once (issue 11): canaries
// planted through the payments API and an order event never appear in clear
// on any page as any role, in the audit export, the websocket frames,
// /metrics, the debug log or the database; a reveal with a reason shows one
// value in exactly its own response, and nowhere afterwards.
func TestCanaryPIINeverInClear(t *testing.T) {
	t.Parallel()
	server := dbtest.URL(t)
	cfg := testConfig(t, server, "--event-rate", "20", "--status-every", "500ms")
	// What LOG_LEVEL=debug would print (cmd/console's newLogger).
	var logBuf, out testkit.Buffer
	logger := slog.New(slog.NewJSONHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx := context.Background()
	d, err := Start(ctx, cfg, &out, logger)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-runErr; err != nil {
			t.Errorf("Run: %v", err)
		}
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()

	// 1. Plant: a real payment through the API, as the demo merchant.
	op := plantPayment(t, out.String())
	// 2. Plant: an order event sealed with the demo's keys.
	orderID := plantOrder(t, d)

	// 3. Wait until the planted events are published.
	var paymentEvents []uuid.UUID
	testkit.Eventually(t, "the planted payment's events to be published", func() (bool, error) {
		page, err := outbox.List(ctx, d.pool, outbox.Filter{AggregateType: "payment", AggregateID: op.String()}, outbox.Page{Limit: 50})
		if err != nil {
			return false, err
		}
		paymentEvents = paymentEvents[:0]
		done := map[string]bool{}
		for _, r := range page.Rows {
			if r.Status != outbox.StatusPublished {
				return false, fmt.Errorf("%s is %s", r.EventType, r.Status)
			}
			paymentEvents = append(paymentEvents, r.ID)
			done[r.EventType] = true
		}
		return done["payment.requested.v1"] && done["payment.completed.v1"], fmt.Errorf("published: %v", done)
	})
	testkit.Eventually(t, "the planted order event to be published", func() (bool, error) {
		r, err := outbox.Get(ctx, d.pool, orderID)
		return err == nil && r.Status == outbox.StatusPublished, err
	})

	// 4. Everything a person or a machine can see, before any reveal.
	users := map[string]*session{}
	for _, u := range []string{"support", "oncall", "auditor", "admin"} {
		users[u] = signIn(t, d, u)
	}
	paths := []string{"/", "/outbox", "/outbox?status=published", "/outbox/" + orderID.String(),
		"/payments", "/payments/" + op.String(), "/inbox", "/jobs", "/approvals", "/audit",
		"/audit/export?format=csv", "/audit/export?format=jsonl"}
	for _, id := range paymentEvents {
		paths = append(paths, "/outbox/"+id.String())
	}
	before := collect(t, d, &logBuf, users, paths)
	browserPass(t, d, op, before)
	assertNoCanary(t, "before the reveal", before)
	logSizes(t, before)

	// The check is not vacuous: the pages did show the planted records, masked.
	if p := before["oncall GET /payments/"+op.String()]; !strings.Contains(p, pii.Mask(pii.Email, canaryEmail)) {
		t.Errorf("the planted payment's page as oncall does not show its masked email %q:\n%s", pii.Mask(pii.Email, canaryEmail), p)
	}
	if p := before["oncall GET /outbox/"+orderID.String()]; !strings.Contains(p, pii.Mask(pii.Name, canaryName)) {
		t.Errorf("the planted order event's page as oncall does not show its masked name %q:\n%s", pii.Mask(pii.Name, canaryName), p)
	}
	assertSealedInDatabase(t, d, op, orderID)

	// 5. Reveal the payment's email as oncall, with a reason: the value in
	// exactly that response.
	oncall := users["oncall"]
	token := oncall.csrf(t, d.ConsoleURL)
	resp, body := oncall.postForm(t, d.ConsoleURL+"/pii/reveal", url.Values{"csrf_token": {token},
		"target_type": {"payment"}, "target_id": {op.String()}, "field": {"email"}, "reason": {"canary test: customer asked to confirm"}})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, canaryEmail) {
		t.Fatalf("reveal: %d %q, want the planted email", resp.StatusCode, body)
	}
	if got := leaks(strings.ReplaceAll(strings.ToLower(body), strings.ToLower(canaryEmail), "")); len(got) != 0 {
		t.Errorf("the reveal of the email also shows %v: %q", got, body)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("reveal Cache-Control %q, want no-store", cc)
	}

	after := collect(t, d, &logBuf, users, paths)
	assertNoCanary(t, "after the reveal", after)
	if exp := after["auditor GET /audit/export?format=jsonl"]; !strings.Contains(exp, "pii.reveal") {
		t.Errorf("the audit export after the reveal has no pii.reveal row:\n%s", exp)
	}
	assertSealedInDatabase(t, d, op, orderID)
}

var (
	bannerAPI = regexp.MustCompile(`curl -i -X POST (\S+) -H 'Idempotency-Key: [^']+' -H 'Authorization: Bearer ([^']+)'`)
	opIDField = regexp.MustCompile(`"operation_id"\s*:\s*"([0-9a-f-]{36})"`)
)

// plantPayment makes a real payment of the demo carrying the canaries, with
// the API key the banner prints, until the provider completes one (its
// faults may decline or lose a few first; those carry the canaries too and
// are scanned like the rest). It returns the completed payment's operation.
func plantPayment(t *testing.T, banner string) uuid.UUID {
	t.Helper()
	m := bannerAPI.FindStringSubmatch(banner)
	if m == nil {
		t.Fatalf("the banner has no payments example:\n%s", banner)
	}
	var last string
	for i := range 20 {
		body, _ := json.Marshal(map[string]any{
			"invoice_id": fmt.Sprintf("inv-canary-%d-%s", i, uuid.NewString()[:8]), "account_id": 1001 + i%demoAccounts,
			"amount": "12.50", "currency": "TRY",
			"customer": map[string]string{"name": canaryName, "email": canaryEmail, "tax_id": canaryTaxID},
		})
		req, _ := http.NewRequest(http.MethodPost, m[1], bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "canary-"+uuid.NewString())
		req.Header.Set("Authorization", "Bearer "+m[2])
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", m[1], err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		last = fmt.Sprintf("%d %s", resp.StatusCode, data)
		if got := leaks(string(data)); len(got) != 0 {
			t.Errorf("the payments API answer carries %v in clear: %s", got, data)
		}
		if resp.StatusCode == http.StatusCreated {
			if id := opIDField.FindSubmatch(data); id != nil {
				return uuid.MustParse(string(id[1]))
			}
			t.Fatalf("a created payment without an operation_id: %s", data)
		}
	}
	t.Fatalf("no canary payment completed in 20 tries; last answer: %s", last)
	return uuid.Nil
}

// plantOrder writes an order.placed.v1 event whose customer fields are
// sealed with the demo's keyring, as a producer with the keys would.
func plantOrder(t *testing.T, d *Demo) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	const orderNo = 987654001
	clear, _ := json.Marshal(map[string]any{"order_id": orderNo, "status": "placed", "amount": "99.90", "currency": "TRY",
		"customer": map[string]string{"name": canaryName, "email": canaryEmail, "phone": canaryPhone}})
	sealed, err := pii.SealPayload(d.payments.kr, "order.placed.v1", id.String(), clear)
	if err != nil {
		t.Fatal(err)
	}
	if got := leaks(string(sealed)); len(got) != 0 {
		t.Fatalf("SealPayload left %v in clear: %s", got, sealed)
	}
	ctx := context.Background()
	if err := db.WithTx(ctx, d.pool, func(tx pgx.Tx) error {
		_, err := outbox.Insert(ctx, tx, outbox.Event{ID: id, AggregateType: "order", AggregateID: fmt.Sprint(orderNo),
			Topic: ordersTopic, EventType: "order.placed.v1", Payload: sealed})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	d.notifier.Poke()
	return id
}

// session is a signed-in browser: a cookie jar that followed the console's
// sign-in through the development provider's form.
type session struct {
	user string
	*http.Client
}

var providerFormID = regexp.MustCompile(`name="id" value="([^"]+)"`)

// signIn signs user in through the provider's login form (password = user
// name), as web's tests do.
func signIn(t *testing.T, d *Demo, user string) *session {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	s := &session{user: user, Client: &http.Client{Jar: jar, Timeout: 30 * time.Second}}
	resp, body := s.get(t, d.ConsoleURL+"/login")
	m := providerFormID.FindStringSubmatch(body)
	if resp.StatusCode != http.StatusOK || m == nil {
		t.Fatalf("%s: no provider login form: %d %s", user, resp.StatusCode, body)
	}
	form := url.Values{"id": {m[1]}, "username": {user}, "password": {user}}
	req, _ := http.NewRequest(http.MethodPost, d.idp.Issuer()+"/login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "text/html")
	resp, err := s.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Request.URL.String(), d.ConsoleURL) {
		t.Fatalf("%s: sign-in ended at %s with %d", user, resp.Request.URL, resp.StatusCode)
	}
	return s
}

func (s *session) get(t *testing.T, u string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	req.Header.Set("Accept", "text/html")
	resp, err := s.Do(req)
	if err != nil {
		t.Fatalf("%s GET %s: %v", s.user, u, err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(data)
}

var csrfInput = regexp.MustCompile(`name="csrf_token" value="([^"]+)"`)

func (s *session) csrf(t *testing.T, base string) string {
	t.Helper()
	_, body := s.get(t, base+"/")
	m := csrfInput.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("%s: no CSRF token on the dashboard", s.user)
	}
	return m[1]
}

func (s *session) postForm(t *testing.T, u string, form url.Values) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "text/html")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	c := *s.Client
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s POST %s: %v", s.user, u, err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(data)
}

// collect gathers every surface: each page as each role, a few dashboard
// websocket frames per role, /metrics, the demo's output and its debug log.
func collect(t *testing.T, d *Demo, log *testkit.Buffer, users map[string]*session, paths []string) map[string]string {
	t.Helper()
	got := map[string]string{}
	for name, s := range users {
		for _, p := range paths {
			resp, body := s.get(t, d.ConsoleURL+p)
			got[name+" GET "+p] = body
			if name == "oncall" && !strings.HasPrefix(p, "/audit") && resp.StatusCode != http.StatusOK {
				t.Errorf("oncall GET %s: %d, want 200", p, resp.StatusCode)
			}
			if name == "auditor" && strings.HasPrefix(p, "/audit") && resp.StatusCode != http.StatusOK {
				t.Errorf("auditor GET %s: %d, want 200", p, resp.StatusCode)
			}
		}
		got[name+" /ws frames"] = wsFrames(t, d, s, 3)
	}
	got["/metrics"] = scrape(t, d.ConsoleURL+"/metrics")
	got["the demo's output"] = d.out.(*testkit.Buffer).String()
	got["the debug log"] = log.String()
	return got
}

// wsFrames reads n frames of the dashboard's websocket as s.
func wsFrames(t *testing.T, d *Demo, s *session, n int) string {
	t.Helper()
	dialer := websocket.Dialer{HandshakeTimeout: 10 * time.Second, Jar: s.Jar}
	hdr := http.Header{"Origin": {d.ConsoleURL}}
	conn, resp, err := dialer.Dial("ws"+strings.TrimPrefix(d.ConsoleURL, "http")+"/ws", hdr)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("%s: dial /ws: %v (%d)", s.user, err, status)
	}
	defer conn.Close()
	var frames strings.Builder
	for range n {
		_ = conn.SetReadDeadline(time.Now().Add(testkit.Deadline))
		_, msg, err := conn.ReadMessage()
		if err != nil {
			t.Fatalf("%s: read /ws: %v", s.user, err)
		}
		frames.Write(msg)
		frames.WriteByte('\n')
	}
	if frames.Len() == 0 {
		t.Fatalf("%s: empty websocket frames", s.user)
	}
	return frames.String()
}

// assertNoCanary fails for every surface (and the debug log) that carries a
// canary in clear, naming the surface, the form and its context.
func assertNoCanary(t *testing.T, when string, surfaces map[string]string) {
	t.Helper()
	names := make([]string, 0, len(surfaces))
	for n := range surfaces {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if got := leaks(surfaces[n]); len(got) != 0 {
			t.Errorf("%s: %s carries %v in clear: …%s…", when, n, got, around(surfaces[n], got[0]))
		}
	}
}

// logSizes says how much of each kind of surface was scanned, so a pass
// over empty pages or a silent log would show.
func logSizes(t *testing.T, surfaces map[string]string) {
	t.Helper()
	var pages, pageBytes int
	for n, s := range surfaces {
		if strings.Contains(n, " GET ") {
			pages++
			pageBytes += len(s)
			continue
		}
		t.Logf("scanned %s: %d bytes", n, len(s))
	}
	t.Logf("scanned %d pages (%d bytes)", pages, pageBytes)
}

// around is the text around needle in s, for a failure message.
func around(s, needle string) string {
	norm := strings.ToLower(html.UnescapeString(jsonEscapes.Replace(s)))
	i := strings.Index(norm, needle)
	if i < 0 {
		return ""
	}
	lo, hi := max(0, i-200), min(len(norm), i+len(needle)+200)
	return norm[lo:hi]
}

// assertSealedInDatabase checks the planted rows are sealed and that no row
// of any table of the demo's database carries a canary in clear.
func assertSealedInDatabase(t *testing.T, d *Demo, op, orderID uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	var customer string
	if err := d.pool.QueryRow(ctx, `SELECT customer::text FROM payment WHERE operation_id = $1`, op).Scan(&customer); err != nil {
		t.Fatal(err)
	}
	if got := leaks(customer); len(got) != 0 || !strings.Contains(customer, "email") {
		t.Errorf("payment.customer of the planted payment: %v in clear: %s", got, customer)
	}
	var payload string
	if err := d.pool.QueryRow(ctx, `SELECT payload::text FROM outbox_event WHERE id = $1`, orderID).Scan(&payload); err != nil {
		t.Fatal(err)
	}
	if got := leaks(payload); len(got) != 0 {
		t.Errorf("the planted order event's payload: %v in clear: %s", got, payload)
	}
	rows, err := d.pool.Query(ctx, `SELECT quote_ident(table_schema) || '.' || quote_ident(table_name) FROM information_schema.tables
		WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')`)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range tables {
		var n int
		if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` AS r WHERE lower(r::text) LIKE ANY ($1)`, likePatterns()).Scan(&n); err != nil {
			t.Fatalf("scan %s: %v", table, err)
		}
		if n != 0 {
			t.Errorf("%d rows of %s carry a canary in clear", n, table)
		}
	}
}

func likePatterns() []string {
	out := make([]string, len(canaryNeedles))
	for i, n := range canaryNeedles {
		out[i] = "%" + n + "%"
	}
	return out
}

const chromiumPath = "/usr/bin/chromium"

// browserPass signs oncall in with a real browser, lets the dashboard take
// a few live updates, opens the planted payment's page, and adds what the
// browser rendered (DOM and visible text) to surfaces.
func browserPass(t *testing.T, d *Demo, op uuid.UUID, surfaces map[string]string) {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("the canary's browser pass needs chromium at %s: apt-get install -y chromium", chromiumPath)
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 860))
	defer cancelAlloc()
	bctx, cancelCtx := chromedp.NewContext(allocCtx)
	defer cancelCtx()
	ctx, cancel := context.WithTimeout(bctx, 3*time.Minute)
	defer cancel()
	if err := chromedp.Do(ctx,
		chromedp.Navigate(d.ConsoleURL+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#username`)),
		chromedp.SendKeys(chromedp.CSS(`#username`), "oncall"),
		chromedp.SendKeys(chromedp.CSS(`#password`), "oncall"),
		chromedp.Click(chromedp.CSS(`#submit`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="nav"]`)),
	); err != nil {
		t.Fatalf("browser: oncall's sign-in: %v", err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](
		`window.__frames = 0; document.body.addEventListener("htmx:wsAfterMessage", () => { window.__frames++ }); true`)); err != nil {
		t.Fatalf("browser: count live updates: %v", err)
	}
	testkit.Eventually(t, "the browser's dashboard to take three live updates", func() (bool, error) {
		return chromedp.Run(ctx, chromedp.Evaluate[bool](`window.__frames >= 3`))
	})
	grab := func(name string) {
		for _, what := range []string{"document.documentElement.outerHTML", "document.body.innerText"} {
			s, err := chromedp.Run(ctx, chromedp.Evaluate[string](what))
			if err != nil {
				t.Fatalf("browser: %s of %s: %v", what, name, err)
			}
			surfaces["browser "+name+" "+what] = s
		}
	}
	grab("dashboard")
	if err := chromedp.Do(ctx, chromedp.Navigate(d.ConsoleURL+"/payments/"+op.String()),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="nav"]`))); err != nil {
		t.Fatalf("browser: the planted payment's page: %v", err)
	}
	grab("payment page")
	if p := surfaces["browser payment page document.body.innerText"]; !strings.Contains(p, pii.Mask(pii.Email, canaryEmail)) {
		t.Errorf("browser: the planted payment's page does not show its masked email:\n%s", p)
	}
}
