package web_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/testkit"
	"github.com/sluice-dev/sluice/web"
)

func TestInboxPageAndDuplicateRatio(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 100 * time.Millisecond})
	ctx := context.Background()
	in := inbox.New(h.pool)
	const evil = `<script>alert(1)</script>" onmouseover="alert(2)" hx-get="/logout`
	for _, m := range []struct{ consumer, id string }{{"billing", "m1"}, {"billing", "m1"}, {"billing", "m2"}, {evil, "x"}} {
		if _, err := in.Handle(ctx, m.consumer, m.id, func(pgx.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	var d *goquery.Document
	testkit.Eventually(t, "both consumers on the inbox page", func() (bool, error) {
		_, body := b.get(t, h.base+"/inbox", "text/html")
		d = doc(t, body)
		return d.Find(`[data-testid="consumer-row"]`).Length() == 2, nil
	})
	billing := d.Find(`[data-testid="consumer-row"]`).FilterFunction(func(_ int, s *goquery.Selection) bool {
		return s.Find(`[data-testid="consumer"]`).Text() == "billing"
	})
	if billing.Find(`[data-testid="processed"]`).Text() != "2" || billing.Find(`[data-testid="duplicates"]`).Text() != "1" ||
		billing.Find(`[data-testid="ratio"]`).Text() != "33.3%" || billing.Find(`[data-testid="spark-processed"]`).Length() != 1 {
		t.Errorf("billing row %q", billing.Text())
	}
	// When it last applied, as of the snapshot: a consumer that stopped shows
	// its silence here, whatever the outbox says.
	if got := billing.Find(`[data-testid="last-applied"]`).Text(); !regexp.MustCompile(`^\d+(\.\d+)?(ms|s) ago$`).MatchString(got) {
		t.Errorf("billing's last apply %q, want seconds ago", got)
	}
	// Set back by hand, as if it had stopped an hour ago.
	if _, err := h.pool.Exec(ctx, `UPDATE inbox_consumer_shard SET applied_at = applied_at - interval '1 hour' WHERE consumer = 'billing'`); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "billing's last apply an hour ago", func() (bool, error) {
		_, body := b.get(t, h.base+"/inbox", "text/html")
		row := doc(t, body).Find(`[data-testid="consumer-row"]`).FilterFunction(func(_ int, s *goquery.Selection) bool {
			return s.Find(`[data-testid="consumer"]`).Text() == "billing"
		})
		got := row.Find(`[data-testid="last-applied"]`).Text()
		return strings.HasPrefix(got, "1h0") && strings.HasSuffix(got, " ago"), fmt.Errorf("billing's last apply %q", got)
	})
	if got := d.Find(`[data-testid="total-ratio"]`).Text(); got != "25.0%" {
		t.Errorf("overall ratio %q, want 25.0%% (1 of 4 deliveries)", got)
	}
	if got := d.Find(`[data-testid="retention"]`).Text(); !strings.Contains(got, "7d0h") || !strings.Contains(got, "the default") ||
		!strings.Contains(got, "yet). A redelivery") {
		t.Errorf("retention before any pruning pass %q", got)
	}
	if got := d.Find(`[data-testid="last-pruned"]`).Text(); !strings.Contains(got, "Never pruned") {
		t.Errorf("last pruned before any pass %q", got)
	}
	// A pruning pass with another retention: the page states that one.
	if _, err := inbox.Prune(ctx, h.pool, 36*time.Hour, 100, time.Now()); err != nil {
		t.Fatal(err)
	}
	_, body := b.get(t, h.base+"/inbox", "text/html")
	pd := doc(t, body)
	if got := pd.Find(`[data-testid="retention"]`).Text(); !strings.Contains(got, "1d12h. A redelivery") || strings.Contains(got, "the default") {
		t.Errorf("retention after a 36h pass %q", got)
	}
	if got := pd.Find(`[data-testid="last-pruned"]`).Text(); !strings.Contains(got, "Last pruned at") || !strings.Contains(got, "0 message ids deleted") {
		t.Errorf("last pruned after a pass %q", got)
	}
	if !strings.Contains(d.Text(), evil) {
		t.Error("a consumer name is not shown as text")
	}
	html, _ := d.Html()
	assertInert(t, "inbox", html)
	_, body = b.get(t, h.base+"/", "text/html")
	if got := doc(t, body).Find(`[data-testid="duplicate-ratio"]`).Text(); got != "25.0%" {
		t.Errorf("dashboard duplicate ratio %q", got)
	}
}

// The dead-letter tile warns from CONSOLE_WARN_DEAD, not from one; the held
// tile counts what dead letters hold back and links to the list.
func TestDashboardWarnsFromItsThresholds(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 100 * time.Millisecond, configure: func(c *web.Config) { c.WarnDead = 2 }})
	plant(t, h, planted{aggID: "a", seq: 1, status: "dead"})
	plant(t, h, planted{aggID: "a", seq: 2})
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	tile := func(id string) *goquery.Selection {
		_, body := b.get(t, h.base+"/", "text/html")
		return doc(t, body).Find(`[data-testid="` + id + `"]`)
	}
	testkit.Eventually(t, "one dead letter, one held event", func() (bool, error) {
		return tile("dead").Text() == "1" && tile("held").Text() == "1", nil
	})
	if tile("dead").Closest(".tile").HasClass("warn") {
		t.Error("one dead letter warns with CONSOLE_WARN_DEAD=2")
	}
	if tile("dead").AttrOr("href", "") != "/outbox?status=dead" || tile("held").AttrOr("href", "") != "/outbox?status=held_dead" {
		t.Error("the dead and held tiles do not open their lists")
	}
	plant(t, h, planted{status: "dead"})
	testkit.Eventually(t, "two dead letters warn", func() (bool, error) {
		s := tile("dead")
		return s.Text() == "2" && s.Closest(".tile").HasClass("warn"), nil
	})
	if hint := tile("dead").Closest(".tile").Find(".hint").Text(); !strings.Contains(hint, "flagged from 2") {
		t.Errorf("hint %q", hint)
	}
}

// The inbox page lists the consumer processes' reports and says what they
// leave unread: a shard count the running relays do not publish on, shards
// no running process may read, a consumer none of whose processes runs. A
// silent process of a consumer that runs elsewhere counts for nothing. The
// dashboard's Consumers tile and /metrics say the same from the same
// snapshot; once everything is read, all three say so.
func TestInboxPageShowsConsumerProcessesAndWhatTheyMiss(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 100 * time.Millisecond})
	ctx := context.Background()
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	testkit.Eventually(t, "the empty state, with no process reporting", func() (bool, error) {
		_, body := b.get(t, h.base+"/inbox", "text/html")
		d := doc(t, body)
		return d.Find(`[data-testid="processes-empty"]`).Length() == 1 && d.Find(`[data-testid="consumer-problem"]`).Length() == 0,
			fmt.Errorf("page %q", d.Find("main").Text())
	})

	if _, err := h.pool.Exec(ctx, `
		INSERT INTO outbox_relay (id, name, host, pid, started_at, seen_at, expires_at, shards, ordered)
		VALUES (gen_random_uuid(), 'relay', 'h1', 1, now(), now(), now() + interval '1 hour', 16, true);
		INSERT INTO inbox_consumer_process (id, consumer, host, pid, started_at, seen_at, expires_at, shards, owned, held, applied, applied_at, failed, failed_at)
		VALUES (gen_random_uuid(), 'orders', 'c1', 11, now(), now(), now() + interval '1 hour', 16, '{0,1,2,3,4,5,6,7}', '{0,1,2,3,4,5,6}', 98765, now() - interval '4 minutes', 14, now() - interval '5 minutes'),
		       (gen_random_uuid(), 'orders', 'c2', 12, now(), now() - interval '10 minutes', now() - interval '9 minutes', 16, '{8,9,10,11,12,13,14,15}', '{8,9,10,11,12,13,14,15}', 5, now() - interval '11 minutes', 0, NULL),
		       (gen_random_uuid(), 'audit', 'c3', 13, now() - interval '1 hour', now(), now() + interval '3 minutes', 8, NULL, '{0,1,2,3,4,5,6,7}', 0, NULL, 2, now() - interval '30 seconds'),
		       (gen_random_uuid(), 'ledger', 'c4', 14, now(), now() - interval '3 minutes', now() - interval '2 minutes', 0, NULL, '{}', 0, NULL, 0, NULL)`); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"audit reads with OUTBOX_SHARDS 8, but the running relays publish with OUTBOX_SHARDS 16: it never sees their events there. Give every relay and consumer the same OUTBOX_SHARDS.",
		"ledger: no process runs; the last one stopped reporting 3m0",
		"orders: shards 8–15 of 16 may be read by no running process (CONSUME_SHARDS_OWNED): their events wait until a process that owns them starts.",
	}
	var d *goquery.Document
	testkit.Eventually(t, "the three problems on the inbox page", func() (bool, error) {
		_, body := b.get(t, h.base+"/inbox", "text/html")
		d = doc(t, body)
		var problems []string
		d.Find(`[data-testid="consumer-problem"]`).Each(func(_ int, s *goquery.Selection) { problems = append(problems, s.Text()) })
		ok := len(problems) == 3 && problems[0] == want[0] && strings.HasPrefix(problems[1], want[1]) && problems[2] == want[2]
		return ok, fmt.Errorf("problems %q", problems)
	})
	rows := d.Find(`[data-testid="process-row"]`)
	// By consumer, a consumer's silent processes after its running ones.
	var got []string
	rows.Each(func(_ int, s *goquery.Selection) {
		got = append(got, strings.Join([]string{s.Find(`[data-testid="process-consumer"]`).Text(),
			s.Find(`[data-testid="process-shards"]`).Text(), s.Find(`[data-testid="process-reads"]`).Text(),
			s.Find(`[data-testid="process-applied"]`).Text(),
			regexp.MustCompile(`\d\ds`).ReplaceAllString(s.Find(`[data-testid="process-last-apply"]`).Text(), "Ns"),
			fmt.Sprint(s.HasClass("warn"))}, " | "))
	})
	wantRows := []string{
		"audit | 8 | 0–7 · may read any | 0 | none yet | true",
		"ledger | unsharded | every message | 0 | none yet | true",
		"orders | 16 | 0–6 · may read 0–7 | 98,765 | 4mNs ago | false",
		"orders | 16 | 8–15 · may read 8–15 | 5 | 11mNs ago | true",
	}
	if fmt.Sprint(got) != fmt.Sprint(wantRows) {
		t.Errorf("rows:\n got %q\nwant %q", got, wantRows)
	}
	if st := rows.Eq(3).Find(`[data-testid="process-state"]`).Text(); !regexp.MustCompile(`^silent for 10m\d\ds: stopped reporting without signing off$`).MatchString(st) {
		t.Errorf("silent process's state %q", st)
	}
	// audit failed and never applied since: failing; orders's c1 failed
	// before its last apply: running, its failures told.
	if st := rows.Eq(0).Find(`[data-testid="process-state"]`).Text(); !regexp.MustCompile(`^running, failing: what it reads does not apply; its log says why · last failure 3\d(\.\d+)?s ago, 2 since it started$`).MatchString(st) {
		t.Errorf("failing process's state %q", st)
	}
	if st := rows.Eq(2).Find(`[data-testid="process-state"]`).Text(); !regexp.MustCompile(`^running · last failure 5m\d\ds ago, 14 since it started$`).MatchString(st) {
		t.Errorf("a process that failed before its last apply: state %q", st)
	}
	// The same on the dashboard's tile and /metrics.
	testkit.Eventually(t, "the Consumers tile to flag them", func() (bool, error) {
		_, body := b.get(t, h.base+"/", "text/html")
		tile := doc(t, body).Find(`[data-testid="consumers"]`)
		hint := strings.TrimSpace(tile.Closest(".tile").Find(".hint").Text())
		return strings.TrimSpace(tile.Text()) == "2" && tile.Closest(".tile").HasClass("warn") &&
				hint == "audit reads OUTBOX_SHARDS 8; relays publish on 16; 2 more: events left unread, see the inbox page",
			fmt.Errorf("consumers tile %q (%q)", strings.TrimSpace(tile.Text()), hint)
	})
	testkit.Eventually(t, "/metrics to agree", func() (bool, error) {
		_, body := b.get(t, h.base+"/metrics", "")
		lines := grepLines(body, "sluice_inbox_consumer_")
		return strings.Contains(body, "\nsluice_inbox_consumer_problems 3\n") &&
			strings.Contains(body, "\nsluice_inbox_consumer_processes{state=\"running\"} 2\n") &&
			strings.Contains(body, "\nsluice_inbox_consumer_processes{state=\"silent\"} 2\n"), fmt.Errorf("metrics:\n%s", lines)
	})

	// The second process of orders comes back, audit restarts on the
	// relays' count and ledger's dead process is set back past the hour:
	// nothing is left unread.
	if _, err := h.pool.Exec(ctx, `
		UPDATE inbox_consumer_process SET seen_at = now(), expires_at = now() + interval '1 hour' WHERE host = 'c2';
		UPDATE inbox_consumer_process SET shards = 16, held = '{0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15}', applied = 3, applied_at = now() WHERE consumer = 'audit';
		UPDATE inbox_consumer_process SET seen_at = now() - interval '2 hours', expires_at = now() - interval '2 hours' WHERE consumer = 'ledger'`); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "nothing flagged any more", func() (bool, error) {
		_, body := b.get(t, h.base+"/inbox", "text/html")
		d := doc(t, body)
		_, dash := b.get(t, h.base+"/", "text/html")
		tile := doc(t, dash).Find(`[data-testid="consumers"]`)
		_, metrics := b.get(t, h.base+"/metrics", "")
		ok := d.Find(`[data-testid="consumer-problem"]`).Length() == 0 && d.Find(`tr.warn[data-testid="process-row"]`).Length() == 0 &&
			d.Find(`[data-testid="process-row"]`).Length() == 3 &&
			strings.TrimSpace(tile.Text()) == "3" && !tile.Closest(".tile").HasClass("warn") &&
			strings.Contains(metrics, "\nsluice_inbox_consumer_problems 0\n")
		return ok, fmt.Errorf("problems %q, tile %q (%q), metrics:\n%s", d.Find(`[data-testid="consumer-problem"]`).Text(),
			strings.TrimSpace(tile.Text()), tile.Closest(".tile").Find(".hint").Text(), grepLines(metrics, "sluice_inbox_consumer_"))
	})
}
