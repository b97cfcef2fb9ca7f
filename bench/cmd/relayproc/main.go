// Command relayproc is one outbox.Relay in its own process, for the crash
// workload (R5) of bench/cmd/benchrun, which kills it with SIGKILL. Its
// broker is its standard output: each published event's id is written as
// one line in one write(2) before the relay marks it, so what the process
// wrote before dying is exactly what a broker would have received.
package main

import (
	"context"
	"flag"
	"log"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/outbox"
)

type stdoutSink struct{ mu sync.Mutex }

func (s *stdoutSink) Publish(_ context.Context, m broker.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := os.Stdout.Write([]byte(m.ID + "\n"))
	return err
}

func main() {
	url := flag.String("db", "", "database URL")
	name := flag.String("name", "relayproc", "relay name")
	batch := flag.Int("batch", 100, "batch size")
	lease := flag.Duration("lease", 2*time.Second, "claim lease (a killed relay's claims come back after it)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, *url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	r, err := outbox.NewRelay(pool, &stdoutSink{}, outbox.RelayConfig{Name: *name, BatchSize: *batch, Lease: *lease,
		PollInterval: 50 * time.Millisecond}, nil, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
