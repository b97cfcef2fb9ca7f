package config

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func parseDemo(args []string, lookup Lookup) (Demo, error) {
	var c Demo
	f := NewFlags("demo", "", lookup, io.Discard)
	c.Register(f)
	if err := f.Parse(args); err != nil {
		return c, err
	}
	return c, c.Validate()
}

func TestFlagWinsOverEnvironment(t *testing.T) {
	t.Parallel()
	c, err := parseDemo([]string{"--relays", "3"}, MapLookup(map[string]string{"DEMO_RELAYS": "7", "DEMO_STATUS_EVERY": "2s"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Relays != 3 {
		t.Errorf("relays = %d, want the flag's 3", c.Relays)
	}
	if c.StatusEvery != 2*time.Second {
		t.Errorf("status every = %s, want the environment's 2s", c.StatusEvery)
	}
	if c.PublicURL != "http://127.0.0.1:8080" {
		t.Errorf("public URL = %q, want it derived from the console address", c.PublicURL)
	}
}

func TestMalformedSettingNamesTheVariable(t *testing.T) {
	t.Parallel()
	cases := map[string]map[string]string{
		"DEMO_RELAYS":        {"DEMO_RELAYS": "many"},
		"DEMO_STATUS_EVERY":  {"DEMO_STATUS_EVERY": "5 parsecs"},
		"CONSOLE_ADDR":       {"CONSOLE_ADDR": "no-port"},
		"BROKER_URL":         {"BROKER_URL": "kafka://127.0.0.1:9092"},
		"DATABASE_URL":       {"DATABASE_URL": "mysql://x@127.0.0.1/db"},
		"LOG_LEVEL":          {"LOG_LEVEL": "loud"},
		"CONSOLE_PUBLIC_URL": {"CONSOLE_PUBLIC_URL": "not a url"},
		// The loopback rule holds for the demo as for serve, before anything starts.
		"CONSOLE_PUBLIC_URL: plain http": {"CONSOLE_PUBLIC_URL": "http://console.example.com"},
	}
	for want, env := range cases {
		_, err := parseDemo(nil, MapLookup(env))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("env %v: err = %v, want one naming %s", env, err, want)
		}
	}
}

func TestBadFlagIsAUsageError(t *testing.T) {
	t.Parallel()
	_, err := parseDemo([]string{"--no-such-flag"}, MapLookup(nil))
	var uerr *UsageError
	if !errors.As(err, &uerr) {
		t.Fatalf("err = %v, want a UsageError", err)
	}
	_, err = parseDemo([]string{"--help"}, MapLookup(nil))
	if !errors.Is(err, ErrHelp) {
		t.Fatalf("--help: err = %v, want ErrHelp", err)
	}
}
