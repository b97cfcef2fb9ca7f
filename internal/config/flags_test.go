package config

import (
	"errors"
	"io"
	"reflect"
	"testing"
)

func TestFlagsMayFollowPositionalArguments(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args     []string
		url      string
		reason   string
		dry      bool
		wantArgs []string
	}{
		{[]string{"status", "--database-url", "X"}, "X", "", false, []string{"status"}},
		{[]string{"--database-url", "X", "status"}, "X", "", false, []string{"status"}},
		{[]string{"pause", "orders", "--reason", "broker migration", "--dry-run"}, "", "broker migration", true, []string{"pause", "orders"}},
		{[]string{"pause", "--dry-run", "orders"}, "", "", true, []string{"pause", "orders"}},
		{[]string{"pause", "--", "--not-a-flag"}, "", "", false, []string{"pause", "--not-a-flag"}},
		{[]string{"pause", "--reason", "--", "orders"}, "", "--", false, []string{"pause", "orders"}},
		{[]string{"pause", "--reason=--", "--", "-x"}, "", "--", false, []string{"pause", "-x"}},
	}
	for _, c := range cases {
		var url, reason string
		var dry bool
		f := NewFlags("t", "test", nil, io.Discard)
		f.String(&url, "database-url", "", "", "")
		f.String(&reason, "reason", "", "", "")
		f.Bool(&dry, "dry-run", "", false, "")
		if err := f.Parse(c.args); err != nil {
			t.Errorf("%q: %v", c.args, err)
			continue
		}
		if url != c.url || reason != c.reason || dry != c.dry || !reflect.DeepEqual(f.Args(), c.wantArgs) {
			t.Errorf("%q: url %q reason %q dry %v args %q; want %q %q %v %q", c.args, url, reason, dry, f.Args(), c.url, c.reason, c.dry, c.wantArgs)
		}
	}
}

func TestHelpAfterAVerbIsHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"up", "--help"}, {"up", "-h"}, {"--help", "up"}} {
		f := NewFlags("migrate", "test", nil, io.Discard)
		if err := f.Parse(args); !errors.Is(err, ErrHelp) {
			t.Errorf("%q: %v, want ErrHelp", args, err)
		}
	}
	f := NewFlags("migrate", "test", nil, io.Discard)
	var ue *UsageError
	if err := f.Parse([]string{"up", "--bogus"}); !errors.As(err, &ue) {
		t.Errorf("an unknown flag after the verb: %v, want a usage error", err)
	}
}
