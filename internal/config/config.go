// Package config reads typed configuration from flags and their environment
// twins, validated once at start-up. Every flag has an environment variable;
// a flag given on the command line wins over the environment. A malformed
// value stops start-up with one line naming the variable and what is wrong.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Lookup reads one environment variable (os.LookupEnv in production, a map in
// tests: no test ever calls os.Setenv).
type Lookup func(key string) (string, bool)

// MapLookup is a Lookup over a map, for tests.
func MapLookup(m map[string]string) Lookup {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// ErrHelp is returned when the user asked for --help (usage was printed).
var ErrHelp = flag.ErrHelp

// UsageError marks a command-line mistake (exit code 2).
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Flags is a flag set whose every flag has an environment twin.
type Flags struct {
	fs     *flag.FlagSet
	lookup Lookup
	envErr []error
	out    io.Writer
	args   []string // positional arguments, in order
}

// NewFlags starts a flag set for subcommand name; usage text goes to out.
func NewFlags(name, summary string, lookup Lookup, out io.Writer) *Flags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	f := &Flags{fs: fs, lookup: lookup, out: out}
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: console %s [flags]\n\n%s\n\nFlags (each has an environment variable twin; a flag wins):\n", name, summary)
		fs.PrintDefaults()
	}
	return f
}

// FlagSet exposes the underlying set (for positional arguments).
func (f *Flags) FlagSet() *flag.FlagSet { return f.fs }

func (f *Flags) env(name string) (string, bool) {
	if f.lookup == nil || name == "" {
		return "", false
	}
	v, ok := f.lookup(name)
	if !ok || v == "" {
		return "", false
	}
	return v, true
}

func usageWithEnv(usage, env string, set bool) string {
	switch {
	case env == "":
		return usage
	case set:
		return usage + " (env " + env + ", set)"
	}
	return usage + " (env " + env + ")"
}

// shown registers the flag just defined with its built-in default as the
// one usage prints, never the environment's value, which seeds the flag's
// value only: that value may be a secret (PII_KEYS, OIDC_CLIENT_SECRET, a
// DATABASE_URL with its password), and usage is printed on --help and, to
// stderr where logs collect it, on every mistyped flag. The usage text says
// when the variable is set.
func (f *Flags) shown(name, builtin string) {
	f.fs.Lookup(name).DefValue = builtin
}

// String registers a string flag.
func (f *Flags) String(p *string, name, env, def, usage string) {
	builtin := def
	v, set := f.env(env)
	if set {
		def = v
	}
	f.fs.StringVar(p, name, def, usageWithEnv(usage, env, set))
	f.shown(name, builtin)
}

// Int registers an int flag.
func (f *Flags) Int(p *int, name, env string, def int, usage string) {
	builtin := def
	v, set := f.env(env)
	if set {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			f.envErr = append(f.envErr, fmt.Errorf("%s: %q is not a whole number", env, v))
		} else {
			def = n
		}
	}
	f.fs.IntVar(p, name, def, usageWithEnv(usage, env, set))
	f.shown(name, strconv.Itoa(builtin))
}

// Duration registers a duration flag (Go syntax: 500ms, 30s, 72h).
func (f *Flags) Duration(p *time.Duration, name, env string, def time.Duration, usage string) {
	builtin := def
	v, set := f.env(env)
	if set {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil {
			f.envErr = append(f.envErr, fmt.Errorf("%s: %q is not a duration (examples: 500ms, 30s, 72h)", env, v))
		} else {
			def = d
		}
	}
	f.fs.DurationVar(p, name, def, usageWithEnv(usage, env, set))
	f.shown(name, builtin.String())
}

// Bool registers a boolean flag.
func (f *Flags) Bool(p *bool, name, env string, def bool, usage string) {
	builtin := def
	v, set := f.env(env)
	if set {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			f.envErr = append(f.envErr, fmt.Errorf("%s: %q is not true or false", env, v))
		} else {
			def = b
		}
	}
	f.fs.BoolVar(p, name, def, usageWithEnv(usage, env, set))
	f.shown(name, strconv.FormatBool(builtin))
}

// Parse reads the command line. It returns ErrHelp after printing usage, a
// *UsageError for a bad command line, or the first malformed environment value.
//
// Flags and positional arguments may be interleaved (`console migrate status
// --database-url X` and `console migrate --database-url X status` mean the
// same): the standard flag package stops at the first positional argument,
// which left `migrate up --help` running the migration instead of printing
// help. A lone `--` ends the flags; everything after it is positional.
func (f *Flags) Parse(args []string) error {
	f.args = nil
	for rest := args; ; {
		if err := f.fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return ErrHelp
			}
			return &UsageError{Err: err}
		}
		left := f.fs.Args()
		if consumed := len(rest) - len(left); consumed > 0 && rest[consumed-1] == "--" && !f.isValueOf(rest, consumed-1) {
			f.args = append(f.args, left...)
			break
		}
		if len(left) == 0 {
			break
		}
		f.args = append(f.args, left[0])
		rest = left[1:]
	}
	if len(f.envErr) > 0 {
		return f.envErr[0]
	}
	return nil
}

// isValueOf reports whether rest[i] is the value of the flag before it
// (`--reason --`), not the end-of-flags marker.
func (f *Flags) isValueOf(rest []string, i int) bool {
	if i == 0 {
		return false
	}
	name := strings.TrimLeft(rest[i-1], "-")
	if !strings.HasPrefix(rest[i-1], "-") || strings.Contains(name, "=") {
		return false
	}
	fl := f.fs.Lookup(name)
	if fl == nil {
		return false
	}
	b, ok := fl.Value.(interface{ IsBoolFlag() bool })
	return !ok || !b.IsBoolFlag()
}

// Args are the positional arguments, wherever they stood among the flags.
func (f *Flags) Args() []string { return f.args }

// --- validation helpers: each message names the variable -----------------

// Check collects validation errors and reports the first.
type Check struct{ errs []error }

// Failf records a problem.
func (c *Check) Failf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf(format, args...))
}

// Add records err, if any (a check owned by another package, whose message
// already names the variable).
func (c *Check) Add(err error) {
	if err != nil {
		c.errs = append(c.errs, err)
	}
}

// Err is the first problem, or nil. Checks run in a fixed order (never over
// a map), so the same input always reports the same first problem.
func (c *Check) Err() error {
	if len(c.errs) == 0 {
		return nil
	}
	return c.errs[0]
}

// Required fails when v is empty.
func (c *Check) Required(env, v string) {
	if strings.TrimSpace(v) == "" {
		c.Failf("%s is required", env)
	}
}

// Positive fails when n <= 0.
func (c *Check) Positive(env string, n int) {
	if n <= 0 {
		c.Failf("%s must be greater than 0 (got %d)", env, n)
	}
}

// PositiveDuration fails when d <= 0.
func (c *Check) PositiveDuration(env string, d time.Duration) {
	if d <= 0 {
		c.Failf("%s must be a positive duration (got %s)", env, d)
	}
}

// Addr fails when v is not host:port.
func (c *Check) Addr(env, v string) {
	if v == "" {
		return
	}
	if _, _, err := net.SplitHostPort(v); err != nil {
		c.Failf("%s: %q is not host:port", env, v)
	}
}

// URL fails when v is not an absolute URL with one of the schemes; empty
// passes (Required says whether it may be). It reports whether v is such a
// URL, so checks of its parts can follow.
func (c *Check) URL(env, v string, schemes ...string) bool {
	if v == "" {
		return false
	}
	u, err := url.Parse(v)
	if err != nil || u.Host == "" {
		// The value is not printed: a URL may carry a password
		// (DATABASE_URL, BROKER_URL), and this line goes to stderr.
		c.Failf("%s is not an absolute URL (write %s://host…; its value is not shown, as it may hold a password)", env, schemes[0])
		return false
	}
	for _, s := range schemes {
		if u.Scheme == s {
			return true
		}
	}
	c.Failf("%s: scheme %q is not one of %s", env, u.Scheme, strings.Join(schemes, ", "))
	return false
}

// DatabaseURL fails when v is not a PostgreSQL URL or keyword/value string.
func (c *Check) DatabaseURL(env, v string) {
	if v == "" {
		c.Failf("%s is required (a PostgreSQL ≥ 15 URL, e.g. postgres://user@127.0.0.1:5432/sluice)", env)
		return
	}
	if strings.Contains(v, "://") {
		c.URL(env, v, "postgres", "postgresql")
	}
}
