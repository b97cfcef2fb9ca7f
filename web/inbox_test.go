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
