package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/natsbroker"
	"github.com/sluice-dev/sluice/internal/broker/natsembedded"
)

// sink is where every system under test sends its events: the same object
// for all of them in one run.
type sink interface {
	broker.Publisher
	name() string
	reset(ctx context.Context) error // empties the sink between runs
	count() int64                    // messages accepted since the last reset
}

// nullSink accepts everything at once (R1 a).
type nullSink struct{ n atomic.Int64 }

func (s *nullSink) Publish(context.Context, broker.Message) error { s.n.Add(1); return nil }
func (s *nullSink) name() string                                  { return "null" }
func (s *nullSink) reset(context.Context) error                   { s.n.Store(0); return nil }
func (s *nullSink) count() int64                                  { return s.n.Load() }

// natsSink is an embedded NATS server with JetStream (file storage) and the
// product's adapter, natsbroker: acked publishes, one stream (R1 b).
type natsSink struct {
	srv *natsembedded.Server
	dir string
	js  *natsbroker.JetStream
	nc  *nats.Conn // the bare loop's own connection, and purging
	raw jetstream.JetStream
	n   atomic.Int64
}

func startNATS(ctx context.Context) (*natsSink, error) {
	dir, err := os.MkdirTemp("", "sluice-bench-nats-")
	if err != nil {
		return nil, err
	}
	srv, err := natsembedded.Start(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	js, err := natsbroker.Open(ctx, srv.ClientURL(), broker.Options{Namespace: "bench"})
	if err != nil {
		srv.Shutdown()
		os.RemoveAll(dir)
		return nil, err
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		js.Close()
		srv.Shutdown()
		os.RemoveAll(dir)
		return nil, err
	}
	raw, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		js.Close()
		srv.Shutdown()
		os.RemoveAll(dir)
		return nil, err
	}
	return &natsSink{srv: srv, dir: dir, js: js, nc: nc, raw: raw}, nil
}

func (s *natsSink) Publish(ctx context.Context, msg broker.Message) error {
	if err := s.js.Publish(ctx, msg); err != nil {
		return err
	}
	s.n.Add(1)
	return nil
}

// PublishBatch passes natsbroker's batch publish through, so the relay sees
// the sink as the broker.BatchPublisher it is.
func (s *natsSink) PublishBatch(ctx context.Context, msgs []broker.Message) []error {
	errs := s.js.PublishBatch(ctx, msgs)
	for _, err := range errs {
		if err == nil {
			s.n.Add(1)
		}
	}
	return errs
}

// publishBatch is the bare loop's publish: every message of the batch sent
// asynchronously on the loop's own connection, then one wait for all the
// acks. Subject and headers are those natsbroker writes.
func (s *natsSink) publishBatch(ctx context.Context, msgs []broker.Message) error {
	futs := make([]jetstream.PubAckFuture, 0, len(msgs))
	for _, msg := range msgs {
		m := nats.NewMsg(s.js.Subject(msg.Topic))
		for k, v := range msg.Headers {
			m.Header.Set(k, v)
		}
		m.Header.Set(jetstream.MsgIDHeader, msg.ID)
		m.Header.Set(broker.HeaderAggregateType, msg.AggregateType)
		m.Header.Set(broker.HeaderAggregateID, msg.AggregateID)
		m.Header.Set(broker.HeaderAggregateSeq, strconv.FormatInt(msg.AggregateSeq, 10))
		m.Header.Set(broker.HeaderEventType, msg.EventType)
		m.Data = msg.Payload
		f, err := s.raw.PublishMsgAsync(m)
		if err != nil {
			return err
		}
		futs = append(futs, f)
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.n.Add(int64(len(msgs)))
	return nil
}

func (s *natsSink) name() string { return "nats" }
func (s *natsSink) count() int64 { return s.n.Load() }

func (s *natsSink) reset(ctx context.Context) error {
	s.n.Store(0)
	js, err := jetstream.New(s.nc)
	if err != nil {
		return err
	}
	st, err := js.Stream(ctx, s.js.Stream())
	if err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	return st.Purge(ctx)
}

func (s *natsSink) close() {
	s.nc.Close()
	s.js.Close()
	s.srv.Shutdown()
	os.RemoveAll(s.dir)
}
