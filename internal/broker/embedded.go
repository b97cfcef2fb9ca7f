package broker

import (
	"errors"
	"fmt"
	"net"
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
	return StartEmbeddedNATSAt(dir, -1)
}

// StartEmbeddedNATSAt is StartEmbeddedNATS on a fixed port (-1: a random
// one). Starting a server again on the port and folder of one that was shut
// down is a broker restart: its streams and consumers come back from dir and
// clients reconnect on their own, which is how tests play a broker outage.
func StartEmbeddedNATSAt(dir string, port int) (*EmbeddedNATS, error) {
	srv, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      port,
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

// Port is the port the server listens on.
func (e *EmbeddedNATS) Port() int { return e.srv.Addr().(*net.TCPAddr).Port }

// ClientURL is the nats:// URL clients connect to.
func (e *EmbeddedNATS) ClientURL() string { return e.srv.ClientURL() }

// Shutdown stops the server and waits until it has stopped.
func (e *EmbeddedNATS) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}
