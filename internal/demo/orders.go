package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
)

// The order workload is the demo's business: each step changes a demo_order
// row and writes its event in the same transaction, so the relay has a steady
// stream to publish and per-aggregate order matters (placed → paid → shipped).
const ordersTopic = "sluice.orders"

// demo_order belongs to the demo, not to the product schema; it lives only in
// the demo's own database.
const ordersTable = `CREATE TABLE IF NOT EXISTS demo_order (
	order_id   bigint PRIMARY KEY,
	status     text NOT NULL,
	amount     numeric(18,2) NOT NULL,
	updated_at timestamptz NOT NULL DEFAULT now()
)`

type orderWorkload struct {
	pool    *pgxpool.Pool
	log     *slog.Logger
	rate    int    // business transactions per second
	poke    func() // wakes the relays after a commit
	written atomic.Int64
	nextID  atomic.Int64
}

// newOrderWorkload writes orders into demo_order, which Start creates as
// the database's owner (the services' role may not create tables).
func newOrderWorkload(pool *pgxpool.Pool, rate int, poke func(), log *slog.Logger) *orderWorkload {
	return &orderWorkload{pool: pool, rate: rate, poke: poke, log: log}
}

// run writes rate transactions per second until ctx ends.
func (w *orderWorkload) run(ctx context.Context) error {
	if w.rate <= 0 {
		return nil
	}
	tick := time.NewTicker(time.Second / time.Duration(w.rate))
	defer tick.Stop()
	var failing time.Time // since when steps fail (zero: they do not)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		// A failed step is the database's trouble (a restart, a lock, a
		// cut connection): the business waits and goes on, as an
		// application would. It stopped the whole demo, and removed its
		// database, four seconds into an outage drill.
		if err := w.step(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if failing.IsZero() {
				failing = time.Now()
				w.log.Warn("demo: order workload: writing failed; retrying each tick", "err", err)
			}
			continue
		}
		if !failing.IsZero() {
			w.log.Info("demo: order workload writes again", "after", time.Since(failing).Round(time.Millisecond))
			failing = time.Time{}
		}
		w.poke()
	}
}

// step places a new order or moves a recent one forward.
func (w *orderWorkload) step(ctx context.Context) error {
	next := w.nextID.Load()
	if next < 20 || rand.IntN(3) == 0 {
		id := w.nextID.Add(1)
		amount := fmt.Sprintf("%d.%02d", 10+rand.IntN(490), rand.IntN(100))
		return w.write(ctx, id, "placed", amount)
	}
	// advance a recent order: several events per aggregate, in order
	id := next - rand.Int64N(20)
	return w.write(ctx, id, "", "")
}

var orderNext = map[string]string{"placed": "paid", "paid": "shipped", "shipped": "delivered"}

func (w *orderWorkload) write(ctx context.Context, id int64, status, amount string) error {
	return db.WithTx(ctx, w.pool, func(tx pgx.Tx) error {
		if status == "placed" {
			if _, err := tx.Exec(ctx, `INSERT INTO demo_order (order_id, status, amount) VALUES ($1, 'placed', $2)`, id, amount); err != nil {
				return err
			}
		} else {
			var cur string
			err := tx.QueryRow(ctx, `SELECT status, amount::text FROM demo_order WHERE order_id = $1 FOR UPDATE`, id).Scan(&cur, &amount)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil // not placed yet: nothing to advance
			} else if err != nil {
				return err
			}
			if status = orderNext[cur]; status == "" {
				return nil
			}
			if _, err := tx.Exec(ctx, `UPDATE demo_order SET status = $2, updated_at = now() WHERE order_id = $1`, id, status); err != nil {
				return err
			}
		}
		body := map[string]any{"order_id": id, "status": status, "amount": amount}
		if rand.IntN(poisonOneIn) == 0 {
			body["malformed"] = true // the demo's broker refuses it: see poisonPublisher
		}
		payload, _ := json.Marshal(body)
		_, err := outbox.Insert(ctx, tx, outbox.Event{
			AggregateType: "order",
			AggregateID:   strconv.FormatInt(id, 10),
			Topic:         ordersTopic,
			EventType:     "order." + status + ".v1",
			Payload:       payload,
		})
		if err == nil {
			w.written.Add(1)
		}
		return err
	})
}
