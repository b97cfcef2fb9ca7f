// Package natstest is what tests of the NATS adapter and of the code that
// runs on it share: a JetStream client of the test's own, as an operator's
// tool would be, and the stream changes such a tool makes behind the
// adapter's back (deleting or tuning the stream). Tests only.
package natstest

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Admin is a JetStream client on its own connection to url, closed at the
// test's end.
func Admin(t testing.TB, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect to NATS at %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TuneStream changes stream's settings as an operator would: f edits its
// current config, which is then applied.
func TuneStream(t testing.TB, js jetstream.JetStream, stream string, f func(*jetstream.StreamConfig)) {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	cfg := st.CachedInfo().Config
	f(&cfg)
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatalf("update stream %s: %v", stream, err)
	}
}
