package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/testkit"
	"github.com/sluice-dev/sluice/views"
)

// blockingPublisher holds every publish until released, so the event a
// relay claimed stays in flight for as long as the test looks at it.
type blockingPublisher struct {
	release chan struct{}
}

func (p *blockingPublisher) Publish(ctx context.Context, _ broker.Message) error {
	select {
	case <-p.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Every number has one owner and one definition: the dashboard, /metrics
// and the outbox's own ReadBacklog (what the demo's status line prints) show
// the same backlog, in-flight and dead counts on the same database.
func TestDashboardMetricsAndOutboxAgreeOnTheBacklog(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 50 * time.Millisecond})
	ctx := context.Background()
	var ids []uuid.UUID
	err := db.WithTx(ctx, h.pool, func(tx pgx.Tx) error {
		for i, topic := range []string{"slow", "orders", "orders", "orders", "ledger", "ledger"} {
			id, err := outbox.Insert(ctx, tx, outbox.Event{AggregateType: "agree", AggregateID: fmt.Sprint(i), Topic: topic,
				EventType: "agree.v1", Payload: json.RawMessage(`{}`)})
			if err != nil {
				return err
			}
			ids = append(ids, id.ID)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.DeadLetter(ctx, h.pool, ids[1], outbox.StatusPending, "agreement test"); err != nil {
		t.Fatalf("dead-letter one orders event: %v", err)
	}
	// One relay claims the oldest event ("slow") and holds it in flight.
	pub := &blockingPublisher{release: make(chan struct{})}
	r, err := outbox.NewRelay(h.pool, pub, outbox.RelayConfig{BatchSize: 1, PublishConcurrency: 1, Lease: time.Hour,
		PublishTimeout: time.Hour, DisableListen: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	relayDone := make(chan struct{})
	go func() { defer close(relayDone); _, _ = r.RunOnce(ctx) }()
	t.Cleanup(func() { close(pub.release); <-relayDone })

	var want outbox.Backlog
	testkit.Eventually(t, "the relay to hold one event in flight", func() (bool, error) {
		var err error
		want, err = outbox.ReadBacklog(ctx, h.pool)
		return err == nil && want.InFlight == 1, err
	})
	if want.Pending != 5 || want.InFlight != 1 || want.Dead != 1 {
		t.Fatalf("outbox backlog %+v, want 5 pending (1 in flight) and 1 dead", want)
	}
	perTopic := map[string]int64{}
	for _, tb := range want.Topics {
		perTopic[tb.Topic] = tb.Pending
	}

	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	testkit.Eventually(t, "the dashboard to show the outbox's numbers", func() (bool, error) {
		_, body := b.get(t, h.base+"/", "text/html")
		d := doc(t, body)
		got := map[string]string{}
		for _, id := range []string{"backlog", "in-flight", "dead"} {
			got[id] = strings.TrimSpace(d.Find(`[data-testid="` + id + `"]`).Text())
		}
		exp := map[string]string{"backlog": fmt.Sprint(want.Pending), "in-flight": fmt.Sprint(want.InFlight), "dead": fmt.Sprint(want.Dead)}
		d.Find(`[data-testid="topic-row"]`).Each(func(_ int, s *goquery.Selection) {
			topic := strings.TrimSpace(s.Find(`[data-testid="topic-name"]`).Text())
			got["topic "+topic] = strings.TrimSpace(s.Find(`[data-testid="topic-pending"]`).Text())
		})
		for topic, n := range perTopic {
			exp["topic "+topic] = fmt.Sprint(n)
		}
		return fmt.Sprint(got) == fmt.Sprint(exp), fmt.Errorf("dashboard shows %v, outbox says %v", got, exp)
	})
	testkit.Eventually(t, "/metrics to show the outbox's numbers", func() (bool, error) {
		_, body := b.get(t, h.base+"/metrics", "")
		var missing []string
		for topic, n := range perTopic {
			if line := fmt.Sprintf("sluice_outbox_backlog{topic=%q} %d", topic, n); !strings.Contains(body, line+"\n") {
				missing = append(missing, line)
			}
		}
		if line := fmt.Sprintf("sluice_outbox_dead_letter %d", want.Dead); !strings.Contains(body, line+"\n") {
			missing = append(missing, line)
		}
		return len(missing) == 0, fmt.Errorf("metrics lack %v:\n%s", missing, grepLines(body, "sluice_outbox_"))
	})
}

// Past its limits the held count is a lower bound, and every place that shows
// it says so: outbox.HeldAggregatesCounted+1 aggregates each hold one event
// behind a dead letter; one read looks at the first HeldAggregatesCounted, so
// the tile reads "250+" and /metrics gives 250 with
// sluice_outbox_held_partial 1.
func TestDashboardAndMetricsShowABoundedHeldCountAsALowerBound(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 50 * time.Millisecond})
	ctx := context.Background()
	n := outbox.HeldAggregatesCounted + 1
	bound := views.Count(outbox.HeldAggregatesCounted)
	if _, err := h.pool.Exec(ctx, `
		INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload,
		                          status, dead_at, dead_reason)
		SELECT gen_random_uuid(), 'bounded', 'agg-' || g, s, 'held', 'bounded.v1', '{}',
		       CASE s WHEN 1 THEN 'dead' ELSE 'pending' END,
		       CASE s WHEN 1 THEN now() END, CASE s WHEN 1 THEN 'poison' END
		  FROM generate_series(1, $1::int) g, generate_series(1, 2) s`, n); err != nil {
		t.Fatal(err)
	}
	if _, _, err := outbox.RecountBacklog(ctx, h.pool); err != nil { // rows written by hand
		t.Fatal(err)
	}
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	testkit.Eventually(t, "the dashboard to show a lower bound of the held events", func() (bool, error) {
		_, body := b.get(t, h.base+"/", "text/html")
		d := doc(t, body)
		tile := d.Find(`[data-testid="held"]`)
		got := strings.TrimSpace(tile.Text())
		hint := strings.TrimSpace(tile.Parent().Find(".hint").Text())
		return got == bound+"+" && strings.Contains(hint, bound+"+ aggregates") && strings.Contains(hint, "the list shows them all") &&
				strings.TrimSpace(d.Find(`[data-testid="dead"]`).Text()) == views.Count(int64(n)),
			fmt.Errorf("held tile %q (%q), dead tile %q", got, hint, d.Find(`[data-testid="dead"]`).Text())
	})
	testkit.Eventually(t, "/metrics to flag the held count as a lower bound", func() (bool, error) {
		_, body := b.get(t, h.base+"/metrics", "")
		ok := strings.Contains(body, fmt.Sprintf("\nsluice_outbox_held %d\n", outbox.HeldAggregatesCounted)) &&
			strings.Contains(body, "\nsluice_outbox_held_partial 1\n")
		return ok, fmt.Errorf("metrics:\n%s", grepLines(body, "sluice_outbox_held"))
	})
}

// The relays' reports (outbox_relay) reach the dashboard and /metrics with
// one definition: no relay with events pending is flagged; a relay paused on
// a broker outage is counted and flagged; a relay that dies without signing
// off is silent.
func TestDashboardAndMetricsShowTheRelaysReports(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 50 * time.Millisecond})
	ctx := context.Background()
	if err := db.WithTx(ctx, h.pool, func(tx pgx.Tx) error {
		_, err := outbox.Insert(ctx, tx, outbox.Event{AggregateType: "relays", AggregateID: "1", Topic: "orders",
			EventType: "relays.v1", Payload: json.RawMessage(`{}`)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t)
	h.login(t, b, "oncall", "oncall", "")
	relaysTile := func(want, hint string, metrics ...string) {
		t.Helper()
		testkit.Eventually(t, "the relays tile to read "+want+" ("+hint+")", func() (bool, error) {
			_, body := b.get(t, h.base+"/", "text/html")
			tile := doc(t, body).Find(`[data-testid="relays"]`)
			got := strings.TrimSpace(tile.Text())
			gotHint := strings.TrimSpace(tile.Parent().Find(".hint").Text())
			return got == want && strings.Contains(gotHint, hint) && tile.Parent().HasClass("warn"),
				fmt.Errorf("relays tile %q (%q), warn %v", got, gotHint, tile.Parent().HasClass("warn"))
		})
		testkit.Eventually(t, "/metrics to agree", func() (bool, error) {
			_, body := b.get(t, h.base+"/metrics", "")
			for _, m := range metrics {
				if !strings.Contains(body, "\n"+m+"\n") {
					return false, fmt.Errorf("metrics lack %s:\n%s", m, grepLines(body, "sluice_outbox_relays"))
				}
			}
			return true, nil
		})
	}
	// The relays page lists the one relay, flagged, in the state the tile
	// counts it in; the tile links to it.
	relaysPage := func(state ...string) {
		t.Helper()
		_, body := b.get(t, h.base+"/relays", "text/html")
		d := doc(t, body)
		rows := d.Find(`[data-testid="relay-row"]`)
		got := strings.TrimSpace(rows.Find(`[data-testid="relay-state"]`).Text())
		if rows.Length() != 1 || strings.TrimSpace(rows.Find(`[data-testid="relay-name"]`).Text()) != "paused" || !rows.HasClass("warn") {
			t.Fatalf("relays page lists %d rows (%q), want the one relay, flagged", rows.Length(), strings.TrimSpace(rows.Text()))
		}
		for _, w := range state {
			if !strings.Contains(got, w) {
				t.Fatalf("relays page says %q, want %q", got, w)
			}
		}
		_, body = b.get(t, h.base+"/", "text/html")
		if href := doc(t, body).Find(`[data-testid="relays"]`).AttrOr("href", ""); href != "/relays" {
			t.Fatalf("the relays tile links to %q, want /relays", href)
		}
	}
	_, body := b.get(t, h.base+"/relays", "text/html")
	if empty := strings.TrimSpace(doc(t, body).Find(`[data-testid="relays-empty"]`).Text()); !strings.Contains(empty, "No relay reports") {
		t.Fatalf("relays page with no relay says %q", empty)
	}
	relaysTile("0", "no relay reports: nothing publishes the pending events",
		`sluice_outbox_relays{state="running"} 0`, `sluice_outbox_relays{state="paused"} 0`, `sluice_outbox_relays{state="silent"} 0`,
		`sluice_outbox_relays_failing 0`)

	// A relay whose broker refuses every publish pauses.
	relayPool, err := db.OpenConfig(ctx, h.pool.Config())
	if err != nil {
		t.Fatal(err)
	}
	r, err := outbox.NewRelay(relayPool, refusingPublisher{}, outbox.RelayConfig{Name: "paused", DisableListen: true,
		PollInterval: 10 * time.Millisecond, ReportInterval: 50 * time.Millisecond,
		Backoff: outbox.Backoff{Base: 10 * time.Millisecond, Cap: time.Hour}, OutagePauseCap: 20 * time.Millisecond}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	relayCtx, kill := context.WithCancel(ctx)
	defer kill()
	done := make(chan error, 1)
	go func() { done <- r.Run(relayCtx) }()
	relaysTile("1", "1 of 1 paused for",
		`sluice_outbox_relays{state="running"} 0`, `sluice_outbox_relays{state="paused"} 1`, `sluice_outbox_relays{state="silent"} 0`)
	relaysPage("paused for", "the broker is unavailable")

	// It dies without signing off: its connections go first.
	relayPool.Close()
	kill()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	relaysTile("0", "1 stopped reporting without signing off",
		`sluice_outbox_relays{state="running"} 0`, `sluice_outbox_relays{state="paused"} 0`, `sluice_outbox_relays{state="silent"} 1`)
	relaysPage("silent for", "stopped reporting without signing off")
}

// refusingPublisher is a broker that cannot be reached.
type refusingPublisher struct{}

func (refusingPublisher) Publish(context.Context, broker.Message) error {
	return fmt.Errorf("%w: connection refused", broker.ErrUnavailable)
}

// Running relays that publish differently are flagged on the tile, the
// relays page and /metrics; a silent relay's settings do not count.
func TestRelaysThatPublishDifferentlyAreFlagged(t *testing.T) {
	t.Parallel()
	h := start(t, options{tick: 50 * time.Millisecond})
	if _, err := h.pool.Exec(context.Background(), `
		INSERT INTO outbox_relay (id, name, host, pid, started_at, seen_at, expires_at, shards, ordered, published, published_at, failed, last_error, last_error_at)
		VALUES (gen_random_uuid(), 'sharded', 'h1', 1, now() - interval '1 hour', now(), now() + interval '3 minutes', 16, true, 1234, now() - interval '5 minutes', 3, 'nats: <no responders>', now() - interval '1 minute'),
		       (gen_random_uuid(), 'unsharded', 'h2', 2, now(), now(), now() + interval '1 hour', 0, true, 0, NULL, 0, NULL, NULL),
		       (gen_random_uuid(), 'gone', 'h3', 3, now(), now() - interval '10 minutes', now() - interval '9 minutes', 16, false, 7, now() - interval '10 minutes', 0, NULL, NULL)`); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t)
	h.login(t, b, "support", "support", "")
	testkit.Eventually(t, "the relays tile to flag the disagreement", func() (bool, error) {
		_, body := b.get(t, h.base+"/", "text/html")
		tile := doc(t, body).Find(`[data-testid="relays"]`)
		hint := strings.TrimSpace(tile.Parent().Find(".hint").Text())
		return strings.TrimSpace(tile.Text()) == "2" && tile.Parent().HasClass("warn") &&
				strings.Contains(hint, "relays publish differently (OUTBOX_SHARDS 0 and 16)") && !strings.Contains(hint, "RELAY_ORDERING") &&
				strings.Contains(hint, "; 1 failing: their last attempts failed after their last publish"),
			fmt.Errorf("relays tile %q (%q)", strings.TrimSpace(tile.Text()), hint)
	})
	testkit.Eventually(t, "/metrics to flag it", func() (bool, error) {
		_, body := b.get(t, h.base+"/metrics", "")
		return strings.Contains(body, "\nsluice_outbox_relays_disagree 1\n") && strings.Contains(body, "\nsluice_outbox_relays_failing 1\n"),
			fmt.Errorf("metrics:\n%s", grepLines(body, "sluice_outbox_relays"))
	})
	_, body := b.get(t, h.base+"/relays", "text/html")
	d := doc(t, body)
	if alert := d.Find(`[data-testid="relays-disagree"]`).Text(); !strings.Contains(alert, "OUTBOX_SHARDS 0 and 16") {
		t.Fatalf("relays page warning %q, want it to name OUTBOX_SHARDS 0 and 16", alert)
	}
	got := map[string]string{}
	d.Find(`[data-testid="relay-row"]`).Each(func(_ int, s *goquery.Selection) {
		got[strings.TrimSpace(s.Find(`[data-testid="relay-name"]`).Text())] = strings.TrimSpace(s.Find(`[data-testid="relay-shards"]`).Text()) +
			" " + strings.TrimSpace(s.Find(`[data-testid="relay-ordering"]`).Text()) +
			" " + strings.TrimSpace(s.Find(`[data-testid="relay-published"]`).Text()) +
			" " + regexp.MustCompile(`\d\ds`).ReplaceAllString(strings.TrimSpace(s.Find(`[data-testid="relay-last-publish"]`).Text()), "Ns")
	})
	if fmt.Sprint(got) != "map[gone:16 off 7 10mNs ago sharded:16 on 1,234 5mNs ago unsharded:unsharded on 0 none yet]" {
		t.Fatalf("relays page rows %v", got)
	}
	// The sharded relay failed after its last publish: flagged, in the
	// broker's words (escaped).
	sharded := d.Find(`[data-testid="relay-row"]`).FilterFunction(func(_ int, s *goquery.Selection) bool {
		return strings.TrimSpace(s.Find(`[data-testid="relay-name"]`).Text()) == "sharded"
	})
	lastErr := regexp.MustCompile(`\d\ds`).ReplaceAllString(sharded.Find(`[data-testid="relay-last-error"]`).Text(), "Ns")
	if !sharded.HasClass("warn") || lastErr != "failing: last failure 1mNs ago (3 failed attempts since it started): nats: <no responders>" {
		t.Fatalf("failing relay: warn %v, last error %q", sharded.HasClass("warn"), lastErr)
	}
	if !strings.Contains(body, "nats: &lt;no responders&gt;") {
		t.Fatalf("the broker's error is not escaped on the page")
	}
}
