package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func runConsole(t *testing.T, envs map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, env{lookup: config.MapLookup(envs), stdout: &out, stderr: &errb})
	return code, out.String(), errb.String()
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	if code, _, stderr := runConsole(t, nil, "no-such-subcommand"); code != 2 || !strings.Contains(stderr, "unknown subcommand") {
		t.Errorf("unknown subcommand: code %d stderr %q, want 2 and a reason", code, stderr)
	}
	if code, _, _ := runConsole(t, nil, "migrate", "--bogus"); code != 2 {
		t.Errorf("bad flag: code %d, want 2", code)
	}
	if code, _, stderr := runConsole(t, nil, "migrate", "status"); code != 1 || !strings.Contains(stderr, "DATABASE_URL") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("missing DATABASE_URL: code %d stderr %q, want 1 and one line naming DATABASE_URL", code, stderr)
	}
	for name := range commands() {
		if code, _, _ := runConsole(t, nil, name, "--help"); code != 0 {
			t.Errorf("console %s --help: code %d, want 0", name, code)
		}
	}
}

func TestMigrateUpAndStatus(t *testing.T) {
	t.Parallel()
	envs := map[string]string{"DATABASE_URL": dbtest.EmptyURL(t)}
	code, out, stderr := runConsole(t, envs, "migrate", "status")
	if code != 0 || !strings.Contains(out, "pending: run `console migrate up`") {
		t.Fatalf("status on an empty database: code %d out %q stderr %q", code, out, stderr)
	}
	code, out, stderr = runConsole(t, envs, "migrate", "up")
	want := fmt.Sprintf("schema at version %d", db.LatestVersion())
	if code != 0 || !strings.Contains(out, want) || strings.Contains(out, "applied 0 ") {
		t.Fatalf("up on an empty database: code %d out %q stderr %q", code, out, stderr)
	}
	code, out, _ = runConsole(t, envs, "migrate", "status")
	if code != 0 || !strings.Contains(out, "schema is current") || strings.Contains(out, "pending") {
		t.Fatalf("status after up: code %d out %q", code, out)
	}
	code, out, _ = runConsole(t, envs, "migrate", "up")
	if code != 0 || !strings.Contains(out, "applied 0 migration(s)") {
		t.Fatalf("second up: code %d out %q", code, out)
	}
	code, out, _ = runConsole(t, envs, "version")
	if code != 0 || !strings.Contains(out, "schema ") {
		t.Fatalf("version: code %d out %q", code, out)
	}
}
