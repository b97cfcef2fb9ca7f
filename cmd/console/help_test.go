package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

// `--help` on every subcommand and verb prints help, exits 0 and does
// nothing else: with DATABASE_URL pointing at an empty database, no
// subcommand may have created a table (`migrate up --help` once migrated).
func TestEveryCommandAndVerbAnswersHelpAndDoesNothingElse(t *testing.T) {
	t.Parallel()
	url := dbtest.EmptyURL(t)
	envs := map[string]string{"DATABASE_URL": url}
	for name, cmd := range commands() {
		lines := [][]string{{name, "--help"}, {name, "-h"}}
		for _, v := range cmd.verbs {
			lines = append(lines, []string{name, v, "--help"}, []string{name, v, "-h"})
		}
		for _, args := range lines {
			code, stdout, stderr := runConsole(t, envs, args...)
			if code != 0 {
				t.Errorf("console %s: exit %d, want 0 (stderr %q)", strings.Join(args, " "), code, stderr)
			}
			if !strings.Contains(stdout+stderr, "Usage: console "+name) {
				t.Errorf("console %s printed no usage line: %q", strings.Join(args, " "), stdout+stderr)
			}
			if n := strings.Count(stdout+stderr, "Usage:"); n != 1 {
				t.Errorf("console %s printed %d usage lines, want one: %q", strings.Join(args, " "), n, stdout+stderr)
			}
		}
	}
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var tables int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Errorf("--help created %d table(s) in the database: it must do nothing but print help", tables)
	}
}

// Flags are accepted before and after the verb, and --database-url
// wherever DATABASE_URL is. merchants, outbox, pii and payments read their
// first argument as the verb, so a flag before it was "unknown verb".
func TestFlagsAfterTheVerb(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	settlement := filepath.Join(t.TempDir(), "settlement.csv")
	if err := os.WriteFile(settlement, []byte("0190f3a2-7c1e-7d4b-9a51-1f2e3d4c5b6a,succeeded\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"migrate", "status", "--database-url", url},
		{"migrate", "--database-url", url, "status"},
		{"audit", "verify", "--database-url", url},
		{"audit", "--database-url", url, "verify"},
		{"version", "--database-url", url},
		{"outbox", "--database-url", url, "recount"},
		// A flag's value that is also a verb is a value, not the verb.
		{"outbox", "--reason", "pause", "--database-url", url, "pause", "flags.before"},
		{"outbox", "--reason=back", "resume", "--database-url", url, "flags.before"},
		{"merchants", "--database-url", url, "add", "flags-shop"},
		// Values of a verb's own flags, one of them a verb's name.
		{"merchants", "--name", "help", "--database-url", url, "add", "flags-shop-2"},
		{"merchants", "--name", "Acme", "--database-url", url, "add", "flags-shop-3"},
		// A boolean flag takes no value: keys is the verb.
		{"merchants", "--new", "--database-url", url, "keys", "flags-shop"},
		{"pii", "--id", "k1", "keygen"},
		{"payments", "--database-url", url, "--dry-run", "reconcile", "--file", settlement},
	} {
		code, stdout, stderr := runConsole(t, nil, args...)
		// The settlement file names a payment nobody has: exit 1, having
		// read the file as a reconcile (a usage error is 2).
		if args[0] == "payments" {
			if code != 1 || !strings.Contains(stdout, "dry run") {
				t.Errorf("console %s: exit %d stdout %q stderr %q, want a dry run that finds no payment", strings.Join(args, " "), code, stdout, stderr)
			}
			continue
		}
		if code != 0 {
			t.Errorf("console %s: exit %d stdout %q stderr %q", strings.Join(args, " "), code, stdout, stderr)
		}
		// help's usage also exits 0: an add must say it added.
		if args[0] == "merchants" && slices.Contains(args, "add") && !strings.Contains(stdout, "merchant "+args[len(args)-1]+" added") {
			t.Errorf("console %s did not add: stdout %q", strings.Join(args, " "), stdout)
		}
	}
	// --account's value is not the verb: assign runs, and fails on the
	// account that does not exist (1), not as an unknown verb (2).
	if code, _, stderr := runConsole(t, nil, "merchants", "--account", "7", "--database-url", url, "assign", "flags-shop"); code != 1 || strings.Contains(stderr, "verb") {
		t.Errorf("merchants --account 7 assign: exit %d stderr %q, want assign to run and refuse the missing account", code, stderr)
	}
	for _, args := range [][]string{{"merchants", "--database-url", url}, {"outbox", "--reason", "x"}, {"pii", "--id", "k1"}, {"payments", "--dry-run"}} {
		if code, _, stderr := runConsole(t, nil, args...); code != 2 || !strings.Contains(stderr, "want") {
			t.Errorf("console %s: exit %d stderr %q, want 2 asking for a verb", strings.Join(args, " "), code, stderr)
		}
	}
}

// --database-url is accepted wherever DATABASE_URL is read: every
// subcommand and verb whose help names DATABASE_URL lists the flag, and
// only provider-sim has no database at all.
func TestDatabaseURLFlagWherever(t *testing.T) {
	t.Parallel()
	for name, cmd := range commands() {
		lines := [][]string{{name, "--help"}}
		for _, v := range cmd.verbs {
			lines = append(lines, []string{name, v, "--help"})
		}
		reads := false
		for _, args := range lines {
			_, stdout, stderr := runConsole(t, nil, args...)
			help := stdout + stderr
			if !strings.Contains(help, "DATABASE_URL") {
				continue
			}
			reads = true
			if !strings.Contains(help, "-database-url") {
				t.Errorf("console %s names DATABASE_URL but has no --database-url:\n%s", strings.Join(args, " "), help)
			}
		}
		if !reads && name != "provider-sim" {
			t.Errorf("console %s: help never names DATABASE_URL", name)
		}
	}
}

// Usage never prints a variable's value: the environment seeds a flag's
// value, and the flag package printed it as the flag's default, so `serve
// --help` showed PII_KEYS, OIDC_CLIENT_SECRET and DATABASE_URL's password,
// and a mistyped flag printed the same usage to stderr, where a service's
// log collector keeps it. Every variable every subcommand reads is set to a
// canary here; help and usage errors must name none of them, and say the
// variable is set.
func TestUsageNeverPrintsTheEnvironmentsValues(t *testing.T) {
	t.Parallel()
	// One canary per flag type, each a value its type parses (a string
	// flag takes any), so a typed flag is seeded from it too; the printed
	// form is what usage would show as the default.
	for _, c := range []struct{ value, printed string }{
		{"CANARY-s3cret", "CANARY-s3cret"},
		{"987654321", "987654321"},
		{"987654321s", (987654321 * time.Second).String()},
	} {
		canary := func(string) (string, bool) { return c.value, true }
		for _, args := range subcommandLines() {
			for _, last := range []string{"--help", "--no-such-flag"} {
				var out, errb bytes.Buffer
				code := run(context.Background(), append(append([]string(nil), args...), last), env{lookup: canary, stdout: &out, stderr: &errb})
				all := out.String() + errb.String()
				if i := strings.Index(all, c.printed); i >= 0 {
					t.Errorf("console %s %s (exit %d) printed a variable's value: …%s…", strings.Join(args, " "), last, code,
						all[max(0, i-80):min(len(all), i+40)])
				}
				if last == "--help" && strings.Contains(all, "(env ") && !strings.Contains(all, ", set)") {
					t.Errorf("console %s --help does not say which variables are set: %q", strings.Join(args, " "), all)
				}
			}
		}
	}
}

// subcommandLines are every subcommand and verb as a command line starts:
// ["migrate", "up"], ["relay"] for one without verbs.
func subcommandLines() [][]string {
	var lines [][]string
	for name, cmd := range commands() {
		if len(cmd.verbs) == 0 {
			lines = append(lines, []string{name})
		}
		for _, v := range cmd.verbs {
			lines = append(lines, []string{name, v})
		}
	}
	return lines
}

// A malformed URL setting is named, never printed: DATABASE_URL and
// BROKER_URL may carry a password, and the error goes to stderr.
func TestAMalformedURLIsNotPrinted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ env, url string }{
		{"DATABASE_URL", "postgres://app:hunter2%zz@db/x"},
		{"BROKER_URL", "amqp://app:hunter2@/%zz"},
	} {
		code, stdout, stderr := runConsole(t, map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1:1/x", c.env: c.url}, "relay")
		if code == 0 || !strings.Contains(stderr, c.env) || strings.Contains(stdout+stderr, "hunter2") {
			t.Errorf("%s malformed: exit %d, output %q (want it named, without its password)", c.env, code, stdout+stderr)
		}
	}
}
