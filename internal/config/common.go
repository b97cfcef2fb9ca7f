package config

import (
	"fmt"
	"log/slog"
	"net/url"
	"strings"

	"github.com/sluice-dev/sluice/internal/auth"
)

// The listen addresses of the contract's Environment table, shared by the
// subcommand that serves each one and by the demo, which runs them all.
const (
	DefaultConsoleAddr     = "127.0.0.1:8080"
	DefaultPaymentsAPIAddr = "127.0.0.1:8081"
	DefaultProviderSimAddr = "127.0.0.1:8082"
	defaultLogLevel        = "info"
)

// Common settings every long-running subcommand has. It is embedded in each
// subcommand's config, whose Register and Validate include it.
type Common struct {
	DatabaseURL string
	LogLevel    string
	Telemetry   Telemetry
}

func (c *Common) register(f *Flags) {
	registerDatabaseURL(f, &c.DatabaseURL, "PostgreSQL ≥ 15 connection URL")
	registerLogLevel(f, &c.LogLevel, defaultLogLevel, "debug, info, warn or error")
	c.Telemetry.register(f)
}

func (c *Common) check(ck *Check) {
	ck.DatabaseURL("DATABASE_URL", c.DatabaseURL)
	checkLogLevel(ck, c.LogLevel)
	c.Telemetry.check(ck)
}

// Database configures the subcommands that need nothing but a database
// (`console migrate`, `console audit verify`).
type Database struct {
	DatabaseURL string
}

// Register adds the flag.
func (c *Database) Register(f *Flags) {
	registerDatabaseURL(f, &c.DatabaseURL, "PostgreSQL ≥ 15 connection URL")
}

// Validate checks the setting.
func (c *Database) Validate() error {
	var ck Check
	ck.DatabaseURL("DATABASE_URL", c.DatabaseURL)
	return ck.Err()
}

// Version configures `console version`: the database is optional.
type Version struct {
	DatabaseURL string // empty: only the binary's versions are printed
}

// Register adds the flag.
func (c *Version) Register(f *Flags) {
	registerDatabaseURL(f, &c.DatabaseURL, "optional: also report the database's schema version")
}

// Validate checks the setting when it is given.
func (c *Version) Validate() error {
	var ck Check
	if c.DatabaseURL != "" {
		ck.DatabaseURL("DATABASE_URL", c.DatabaseURL)
	}
	return ck.Err()
}

// registerDatabaseURL is --database-url, DATABASE_URL's twin wherever it is read.
func registerDatabaseURL(f *Flags, p *string, usage string) {
	f.String(p, "database-url", "DATABASE_URL", "", usage)
}

func registerLogLevel(f *Flags, p *string, def, usage string) {
	f.String(p, "log-level", "LOG_LEVEL", def, usage)
}

func checkLogLevel(ck *Check, v string) {
	if _, err := ParseLevel(v); err != nil {
		ck.Failf("LOG_LEVEL: %v", err)
	}
}

// checkPublicURL checks CONSOLE_PUBLIC_URL (serve and demo): an http(s)
// origin without a path, plain http only on loopback.
func checkPublicURL(ck *Check, v string) {
	ck.Required("CONSOLE_PUBLIC_URL", v)
	if !ck.URL("CONSOLE_PUBLIC_URL", v, "http", "https") {
		return
	}
	ck.Add(auth.CheckPlainHTTPOnLoopback("CONSOLE_PUBLIC_URL", v))
	if u, err := url.Parse(v); err == nil && (u.Path != "" && u.Path != "/" || u.RawQuery != "") {
		ck.Failf("CONSOLE_PUBLIC_URL: must be an origin without a path (got %q)", v)
	}
}

// ParseLevel maps LOG_LEVEL to a slog level.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "debug":
		return slog.LevelDebug, nil
	case "", "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("%q is not one of debug, info, warn, error", s)
}
