// Command console is Sluice's one binary: the web console, the outbox relay,
// the reference consumer, the payments service, the simulated provider, the
// migrations and the demo. main only parses the subcommand, builds the
// config, wires the parts and runs them; each subcommand lives in its own file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
)

// env is what a subcommand gets from the outside world; tests pass their own.
type env struct {
	lookup config.Lookup
	stdout io.Writer
	stderr io.Writer
}

type command struct {
	summary string
	verbs   []string // the verbs it takes, if any: `console <subcommand> <verb> [flags]`
	run     func(ctx context.Context, e env, args []string) error
}

func commands() map[string]command {
	return map[string]command{
		"demo":         {"the whole system on one machine, alive in one command", nil, runDemo},
		"serve":        {"the web console", nil, runServe},
		"relay":        {"outbox relay worker (run as many as you like)", nil, runRelay},
		"consume":      {"reference consumer: broker → inbox-deduplicated effect", nil, runConsume},
		"payments-api": {"the reference payments service (Idempotency-Key API, recovery and reconcile workers)", nil, runPaymentsAPI},
		"payments":     {"payments operations: `payments reconcile --file F` applies a provider settlement file", []string{"reconcile"}, runPayments},
		"merchants":    {"merchants of the payments API: `merchants add|assign|keys|revoke` (API keys, account owners)", []string{"add", "assign", "keys", "revoke"}, runMerchants},
		"provider-sim": {"the simulated payment provider (its own HTTP server; fault mix set by flags)", nil, runProviderSim},
		"migrate":      {"apply (`migrate up`) or show (`migrate status`) the embedded schema migrations", []string{"up", "status"}, runMigrate},
		"outbox":       {"`outbox pause|resume TOPIC --reason R`: stop or restart publishing one topic (audited, survives restarts); `outbox recount`: recount the backlog", []string{"pause", "resume", "recount"}, runOutbox},
		"prune":        {"one pruning pass (published outbox rows, inbox rows past retention), in small batches", nil, runPrune},
		"audit":        {"`audit verify [--anchors FILE]`: walk the audit hash chain; `audit anchor`: sign its head", []string{"verify", "anchor"}, runAudit},
		"pii":          {"personal data keys: `pii keygen`, `pii rotate [--dry-run] [--batch N]` (resumable), `pii check` (values per key id)", []string{"keygen", "rotate", "check"}, runPII},
		"db":           {"`db grant --role NAME [--dry-run]`: set up the application role the services run as", []string{"grant"}, runDB},
		"version":      {"version, commit, schema version", nil, runVersion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], env{lookup: os.LookupEnv, stdout: os.Stdout, stderr: os.Stderr})
	stop()
	os.Exit(code)
}

// run is main without the process: exit code 0 ok, 1 failure with a one-line
// reason on stderr, 2 usage error.
func run(ctx context.Context, args []string, e env) int {
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(e.stdout, cmds)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "console: unknown subcommand %q (try `console --help`)\n", args[0])
		return 2
	}
	err := cmd.run(db.WithApplicationName(ctx, "sluice "+args[0]), e, args[1:])
	var uerr *config.UsageError
	switch {
	case err == nil, errors.Is(err, config.ErrHelp):
		return 0
	case errors.As(err, &uerr):
		fmt.Fprintf(e.stderr, "console %s: %v\n", args[0], err)
		return 2
	default:
		fmt.Fprintf(e.stderr, "console %s: %s\n", args[0], oneLine(err))
		return 1
	}
}

func usage(w io.Writer, cmds map[string]command) {
	fmt.Fprintln(w, "Usage: console <subcommand> [verb] [flags]   (flags may follow the verb; `console <subcommand> [verb] --help` for its flags)")
	fmt.Fprintln(w)
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-13s %s\n", n, cmds[n].summary)
	}
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// settings is a subcommand's typed configuration (internal/config): its
// flags, each with an environment twin, and the start-up check.
type settings interface {
	Register(f *config.Flags)
	Validate() error
}

// verbAmongFlags finds a subcommand's verb wherever it stands among the
// flags (README: flags may come before or after the verb): the first
// argument that is neither a flag nor a flag's value. The verbs' settings
// say which flags take a value; a flag none of them knows is passed over
// (the verb's own parse refuses it). It returns the verb and the other
// arguments in their order; ok is false when there is no verb.
func verbAmongFlags(args []string, verbs ...settings) (verb string, rest []string, ok bool) {
	sets := make([]*flag.FlagSet, len(verbs))
	for i, v := range verbs {
		f := config.NewFlags("", "", nil, io.Discard)
		v.Register(f)
		sets[i] = f.FlagSet()
	}
	takesValue := func(name string) bool {
		for _, fs := range sets {
			if fl := fs.Lookup(name); fl != nil {
				b, isBool := fl.Value.(interface{ IsBoolFlag() bool })
				return !isBool || !b.IsBoolFlag()
			}
		}
		return false
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			if i+1 < len(args) {
				return args[i+1], append(append([]string(nil), args[:i+1]...), args[i+2:]...), true
			}
			return "", args, false
		case len(a) > 1 && a[0] == '-':
			if name := strings.TrimLeft(a, "-"); !strings.Contains(name, "=") && takesValue(name) {
				i++
			}
		default:
			return a, append(append([]string(nil), args[:i]...), args[i+1:]...), true
		}
	}
	return "", args, false
}

// verbSummary is a subcommand's usage text as one of its verbs' summary:
// the verb's help prints its own Usage line, so the subcommand's Usage
// lines go.
func verbSummary(usage string) string {
	lines := strings.Split(usage, "\n")
	i := 0
	for i < len(lines) && (strings.HasPrefix(lines[i], "Usage:") || strings.HasPrefix(strings.TrimSpace(lines[i]), "console ")) {
		i++
	}
	return strings.TrimLeft(strings.Join(lines[i:], "\n"), "\n")
}

// askedForHelp reports whether args ask for help without naming a verb.
func askedForHelp(args []string) bool {
	return slices.ContainsFunc(args, func(a string) bool { return a == "-h" || a == "--help" || a == "-help" })
}

// configure is how every subcommand starts: c's flags and their
// environment twins are read from args; the positional arguments (verbs,
// ids) are checked by positional (nil: none allowed), whose errors are usage
// errors; then c is validated. It returns the positional arguments.
func configure(e env, name, summary string, c settings, args []string, positional func([]string) error) ([]string, error) {
	f := config.NewFlags(name, summary, e.lookup, e.stderr)
	c.Register(f)
	if err := f.Parse(args); err != nil {
		return nil, err
	}
	rest := f.Args()
	if positional == nil {
		positional = func(rest []string) error {
			if len(rest) > 0 {
				return fmt.Errorf("unexpected arguments: %v", rest)
			}
			return nil
		}
	}
	if err := positional(rest); err != nil {
		return nil, &config.UsageError{Err: err}
	}
	return rest, c.Validate()
}

// newLogger builds the process logger: JSON on stderr at LOG_LEVEL.
func newLogger(w io.Writer, level string) *slog.Logger {
	lvl, _ := config.ParseLevel(level)
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lvl}))
}
