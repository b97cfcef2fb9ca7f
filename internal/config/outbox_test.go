package config

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

func parseRelay(t *testing.T, env map[string]string, args ...string) (Relay, error) {
	t.Helper()
	var c Relay
	f := NewFlags("relay", "", MapLookup(env), io.Discard)
	c.Register(f)
	if err := f.Parse(args); err != nil {
		return c, err
	}
	return c, c.Validate()
}

func TestRelayConfigDefaultsAndEnvTwins(t *testing.T) {
	t.Parallel()
	base := map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1/db", "BROKER_URL": "nats://127.0.0.1:4222"}
	c, err := parseRelay(t, base)
	if err != nil {
		t.Fatal(err)
	}
	if c.BatchSize != 500 || c.Lease != 30*time.Second || c.PollInterval != time.Second || c.MaxAttempts != 10 ||
		!c.Ordering || c.BackoffBase != time.Second || c.BackoffCap != 5*time.Minute || c.Namespace != "sluice" {
		t.Fatalf("defaults %+v", c)
	}
	env := map[string]string{"RELAY_BATCH_SIZE": "500", "RELAY_ORDERING": "false", "RELAY_LEASE": "1m"}
	for k, v := range base {
		env[k] = v
	}
	c, err = parseRelay(t, env, "-batch-size", "250")
	if err != nil {
		t.Fatal(err)
	}
	if c.BatchSize != 250 || c.Ordering || c.Lease != time.Minute {
		t.Fatalf("flag should win over env, env over default: %+v", c)
	}
}

func TestRelayConfigErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	base := map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1/db", "BROKER_URL": "amqp://guest:guest@127.0.0.1:5672/"}
	for env, want := range map[string]string{
		"BROKER_URL":         "BROKER_URL",
		"RELAY_BATCH_SIZE":   "RELAY_BATCH_SIZE",
		"RELAY_BACKOFF_CAP":  "RELAY_BACKOFF_CAP",
		"RELAY_MAX_ATTEMPTS": "RELAY_MAX_ATTEMPTS",
	} {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		m[env] = map[string]string{"BROKER_URL": "kafka://x:1", "RELAY_BATCH_SIZE": "0", "RELAY_BACKOFF_CAP": "1ms", "RELAY_MAX_ATTEMPTS": "-1"}[env]
		_, err := parseRelay(t, m)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: error %v does not name %s", env, err, want)
		}
	}
}

func TestPruneConfigBoundsTheBatch(t *testing.T) {
	t.Parallel()
	var c Prune
	f := NewFlags("prune", "", MapLookup(map[string]string{"DATABASE_URL": "postgres://u@h/db", "PRUNE_BATCH_SIZE": "6000"}), io.Discard)
	c.Register(f)
	if err := f.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "PRUNE_BATCH_SIZE") {
		t.Fatalf("Validate = %v, want a PRUNE_BATCH_SIZE error", err)
	}
	if c.OutboxRetention != 7*24*time.Hour || c.InboxRetention != 7*24*time.Hour {
		t.Fatalf("retention defaults %s, %s", c.OutboxRetention, c.InboxRetention)
	}
}

func TestConsumeConfigChecksTheConsumerName(t *testing.T) {
	t.Parallel()
	var c Consume
	f := NewFlags("consume", "", MapLookup(map[string]string{"DATABASE_URL": "postgres://u@h/db", "BROKER_URL": "nats://h:4222", "CONSUMER_NAME": "a.b"}), io.Discard)
	c.Register(f)
	if err := f.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "CONSUMER_NAME") {
		t.Fatalf("Validate = %v, want a CONSUMER_NAME error", err)
	}
}

func TestConsumeConfigReadsTheShards(t *testing.T) {
	t.Parallel()
	parse := func(env map[string]string, args ...string) (Consume, error) {
		base := map[string]string{"DATABASE_URL": "postgres://u@h/db", "BROKER_URL": "nats://h:4222"}
		for k, v := range env {
			base[k] = v
		}
		var c Consume
		f := NewFlags("consume", "", MapLookup(base), io.Discard)
		c.Register(f)
		if err := f.Parse(args); err != nil {
			return c, err
		}
		return c, c.Validate()
	}
	c, err := parse(map[string]string{"OUTBOX_SHARDS": "16"}, "--shards-owned", "0-2,7,2")
	if err != nil || c.Shards != 16 || fmt.Sprint(c.Owned) != "[0 1 2 7 2]" || c.BatchSize != 500 {
		t.Fatalf("shards %d owned %v batch %d (%v)", c.Shards, c.Owned, c.BatchSize, err)
	}
	if c, err := parse(nil); err != nil || c.Shards != 0 || c.Owned != nil {
		t.Fatalf("default: shards %d owned %v (%v), want unsharded", c.Shards, c.Owned, err)
	}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"OUTBOX_SHARDS": "16", "CONSUME_SHARDS_OWNED": "3-16"}, "CONSUME_SHARDS_OWNED"},
		{map[string]string{"OUTBOX_SHARDS": "16", "CONSUME_SHARDS_OWNED": "x"}, "CONSUME_SHARDS_OWNED"},
		{map[string]string{"CONSUME_SHARDS_OWNED": "1"}, "CONSUME_SHARDS_OWNED needs OUTBOX_SHARDS"},
		{map[string]string{"OUTBOX_SHARDS": "-1"}, "OUTBOX_SHARDS"},
		{map[string]string{"CONSUME_BATCH_SIZE": "0"}, "CONSUME_BATCH_SIZE"},
	} {
		if _, err := parse(tc.env); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: Validate = %v, want an error naming %s", tc.env, err, tc.want)
		}
	}
}
