package main

import (
	"context"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
)

// readAtRunTime are variables read when a command runs, never as a flag's
// twin (keys that must not appear on a command line), so --help does not
// touch them.
var readAtRunTime = map[string]bool{"AUDIT_SIGNING_KEY": true, "AUDIT_VERIFY_KEY": true}

// Every environment variable a subcommand reads is in README.md, and every
// variable README's tables name is read by some subcommand: a setting
// nobody can find is as good as missing, and a documented one that does
// nothing misleads (an audit found 18 of the first kind).
func TestREADMENamesEveryEnvironmentVariable(t *testing.T) {
	var (
		mu   sync.Mutex
		read = map[string]bool{}
	)
	record := func(key string) (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		read[key] = true
		return "", false
	}
	for _, args := range subcommandLines() {
		// --help registers the flags (each reads its variable) and stops
		// before doing anything.
		if code := run(context.Background(), append(args, "--help"), env{lookup: record, stdout: io.Discard, stderr: io.Discard}); code != 0 {
			t.Fatalf("console %s --help: exit %d", strings.Join(args, " "), code)
		}
	}
	if len(read) < 40 {
		t.Fatalf("only %d variables read: the walk did not register the subcommands' flags", len(read))
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// README may name a family with a wildcard (PROVIDER_SIM_*_RATE).
	var families []*regexp.Regexp
	for _, w := range regexp.MustCompile(`\b[A-Z][A-Z0-9_]*\*[A-Z0-9_]*`).FindAll(readme, -1) {
		families = append(families, regexp.MustCompile(`^`+strings.ReplaceAll(regexp.QuoteMeta(string(w)), `\*`, `[A-Z0-9_]+`)+`$`))
	}
	var missing []string
	for k := range read {
		if regexp.MustCompile(`\b` + regexp.QuoteMeta(k) + `\b`).Match(readme) {
			continue
		}
		covered := false
		for _, f := range families {
			covered = covered || f.MatchString(k)
		}
		if !covered {
			missing = append(missing, k)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("README.md does not name %d variable(s) the subcommands read: %s", len(missing), strings.Join(missing, ", "))
	}
	// The configuration table's rows name variables in their first cell.
	documented := regexp.MustCompile("(?m)^\\| `([A-Z][A-Z0-9_]+)`").FindAllSubmatch(readme, -1)
	for _, m := range documented {
		if k := string(m[1]); !read[k] && !readAtRunTime[k] {
			t.Errorf("README.md's table documents %s, which no subcommand reads", k)
		}
	}
}
