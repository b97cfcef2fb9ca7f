package broker

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// EmbeddedNATS is an in-process NATS server with JetStream, for the demo and
// tests: listening on 127.0.0.1 on a random port, storing under a folder the
// caller owns.
type EmbeddedNATS struct {
	srv *server.Server
}

// StartEmbeddedNATS starts a JetStream-enabled NATS server storing in dir.
func StartEmbeddedNATS(dir string) (*EmbeddedNATS, error) {
	srv, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		JetStream: true,
		StoreDir:  dir,
		NoLog:     true,
		NoSigs:    true,
	})
	if err != nil {
		return nil, fmt.Errorf("broker: embedded NATS: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("broker: embedded NATS did not become ready within 10s")
	}
	return &EmbeddedNATS{srv: srv}, nil
}

// ClientURL is the nats:// URL clients connect to.
func (e *EmbeddedNATS) ClientURL() string { return e.srv.ClientURL() }

// Shutdown stops the server and waits until it has stopped.
func (e *EmbeddedNATS) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}
