package web_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/brokerurl"
	"github.com/sluice-dev/sluice/internal/broker/natsembedded"
	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/testkit"
)

// traceConsumer is the reference consumer's name in the trace tests.
const traceConsumer = "reference"

// flowing runs the real path behind the console until the test ends: a
// relay publishing to embedded NATS JetStream and the reference consumer
// applying each event through the inbox.
func flowing(t *testing.T, h *harness) {
	t.Helper()
	srv, err := natsembedded.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		srv.Shutdown()
	})
	opts := broker.Options{Namespace: "trace"}
	pub, err := brokerurl.Open(ctx, srv.ClientURL(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	sub, err := brokerurl.Open(ctx, srv.ClientURL(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	relay, err := outbox.NewRelay(h.pool, pub, outbox.RelayConfig{PollInterval: 50 * time.Millisecond, DisableListen: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	consumer := &inbox.Consumer{Inbox: inbox.New(h.pool), Name: traceConsumer}
	for name, run := range map[string]func() error{
		"relay":    func() error { return relay.Run(ctx) },
		"consumer": func() error { return consumer.Run(ctx, sub) },
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(); err != nil && ctx.Err() == nil {
				t.Errorf("%s: %v", name, err)
			}
		}()
	}
}

// consumedAll waits until every event of the aggregate is published and
// applied once by the reference consumer; it returns their ids in order.
func consumedAll(t *testing.T, h *harness, aggType, aggID string, want int) []uuid.UUID {
	t.Helper()
	var ids []uuid.UUID
	testkit.Eventually(t, "every event of "+aggType+" "+aggID+" to be published and consumed", func() (bool, error) {
		ids = ids[:0]
		rows, err := h.pool.Query(context.Background(), `
			SELECT e.id FROM outbox_event e
			 WHERE e.aggregate_type = $1 AND e.aggregate_id = $2 AND e.status = 'published'
			   AND EXISTS (SELECT 1 FROM consume_effect x WHERE x.consumer = $3 AND x.event_id = e.id::text)
			 ORDER BY e.aggregate_seq`, aggType, aggID, traceConsumer)
		if err != nil {
			return false, err
		}
		defer rows.Close()
		for rows.Next() {
			var id uuid.UUID
			if err := rows.Scan(&id); err != nil {
				return false, err
			}
			ids = append(ids, id)
		}
		return len(ids) == want, rows.Err()
	})
	return ids
}

// postTraced is a payments API request carrying a W3C traceparent, as a
// traced client sends it.
func (p *paymentsAPI) postTraced(t *testing.T, idemKey, body, traceparent string) apiAnswer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, p.srv.URL+"/v1/payments", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+p.key)
	req.Header.Set("Idempotency-Key", idemKey)
	req.Header.Set("traceparent", traceparent)
	resp, err := p.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return apiAnswer{status: resp.StatusCode, header: resp.Header, body: data}
}
