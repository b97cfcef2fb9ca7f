package config

import (
	"fmt"
	"log/slog"
	"strings"
)

// Common settings every long-running subcommand has.
type Common struct {
	DatabaseURL string
	LogLevel    string
}

// RegisterCommon adds the shared flags.
func RegisterCommon(f *Flags, c *Common) {
	f.String(&c.DatabaseURL, "database-url", "DATABASE_URL", "", "PostgreSQL ≥ 15 connection URL")
	f.String(&c.LogLevel, "log-level", "LOG_LEVEL", "info", "debug, info, warn or error")
}

// Validate checks the shared settings.
func (c *Common) Validate(ck *Check) {
	ck.DatabaseURL("DATABASE_URL", c.DatabaseURL)
	if _, err := ParseLevel(c.LogLevel); err != nil {
		ck.Failf("LOG_LEVEL: %v", err)
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
