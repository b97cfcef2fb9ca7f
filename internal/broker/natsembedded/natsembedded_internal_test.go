package natsembedded

import "testing"

// The embedded server's JetStream syncs each write before it acknowledges
// it (sync_interval: always), so a message the relay marks published
// survives an OS crash. JetStream's default, a sync every two minutes,
// survives a killed process only: which is what chaos tests with kill -9
// saw, and why they never caught it. An OS crash cannot be played in a
// test; the server's own view of its settings is what can be checked.
func TestJetStreamSyncsEveryWriteBeforeItAcknowledges(t *testing.T) {
	t.Parallel()
	s, err := Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	cfg := s.srv.JetStreamConfig()
	if cfg == nil || !cfg.SyncAlways {
		t.Fatalf("JetStream config %+v: want SyncAlways (sync_interval: always)", cfg)
	}
}
