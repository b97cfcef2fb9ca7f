// Package natsembedded runs a NATS server with JetStream inside the process,
// for the demo and tests. It is the only package that links the NATS server;
// production code reaches a broker through natsbroker or rabbitbroker.
package natsembedded

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Server is an in-process NATS server with JetStream, listening on 127.0.0.1
// and storing under a folder the caller owns (with JetStream's default sync:
// see StartAt).
type Server struct {
	srv *server.Server
}

// Start starts a JetStream-enabled NATS server on a random port, storing in
// dir.
func Start(dir string) (*Server, error) {
	return StartAt(dir, -1)
}

// StartAt is Start on a fixed port (-1: a random one). Starting a server
// again on the port and folder of one that was shut down is a broker restart:
// its streams and consumers come back from dir and clients reconnect on their
// own, which is how tests play a broker outage.
func StartAt(dir string, port int) (*Server, error) {
	srv, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      port,
		JetStream: true,
		StoreDir:  dir,
		// JetStream's default sync (every two minutes), not a sync per
		// write: this server runs the demo (its store is removed at exit),
		// tests and the benchmarks only, where an OS crash loses nothing
		// anyone keeps, and a sync per write made publishes under test
		// load outlast their acknowledgement timeout. A server the relays
		// publish to in production is not this one: README ("NATS
		// JetStream: what published means") says it needs
		// sync_interval: always or a replicated stream.
		NoLog:  true,
		NoSigs: true,
	})
	if err != nil {
		return nil, fmt.Errorf("natsembedded: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("natsembedded: the server did not become ready within 10s")
	}
	return &Server{srv: srv}, nil
}

// Port is the port the server listens on.
func (s *Server) Port() int { return s.srv.Addr().(*net.TCPAddr).Port }

// ClientURL is the nats:// URL clients connect to.
func (s *Server) ClientURL() string { return s.srv.ClientURL() }

// Shutdown stops the server and waits until it has stopped.
func (s *Server) Shutdown() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
}
