package main

import (
	"context"
	"strings"
	"testing"

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

// Flags are accepted after the verb, and --database-url wherever
// DATABASE_URL is.
func TestFlagsAfterTheVerb(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	for _, args := range [][]string{
		{"migrate", "status", "--database-url", url},
		{"migrate", "--database-url", url, "status"},
		{"audit", "verify", "--database-url", url},
		{"version", "--database-url", url},
	} {
		if code, stdout, stderr := runConsole(t, nil, args...); code != 0 {
			t.Errorf("console %s: exit %d stdout %q stderr %q", strings.Join(args[:2], " "), code, stdout, stderr)
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
