package demo

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/brokerurl"
	"github.com/sluice-dev/sluice/internal/broker/natsbroker"
	"github.com/sluice-dev/sluice/internal/broker/natsembedded"
	"github.com/sluice-dev/sluice/internal/broker/rabbitbroker"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/demo/devoidc"
	"github.com/sluice-dev/sluice/internal/inbox"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/internal/telemetry"
	"github.com/sluice-dev/sluice/web"
)

// consumerName is the demo consumer's durable subscription and inbox name.
const consumerName = "demo-consumer"

// relayMaxAttempts is low so a refused event reaches the dead letters within
// a minute of being written.
const relayMaxAttempts = 5

// poisonOneIn is how rare the order events that the demo's broker refuses
// are, and redeliveryShare the part of deliveries the consumer sees twice.
const (
	poisonOneIn     = 400
	redeliveryShare = 0.02
)

// Demo is the running system. Start builds it, Run prints its status until
// the context ends, Close removes everything it created.
type Demo struct {
	cfg config.Demo
	out io.Writer
	log *slog.Logger

	db *database
	// appURL connects as the services' role; pool is the demo's own
	// connections (setup, status line, anchors), pools every part's
	// (openPool), closed after the parts stop.
	appURL  string
	pool    *pgxpool.Pool
	pools   []*pgxpool.Pool
	natsDir string
	nats    *natsembedded.Server
	brokers []broker.Broker
	// ownNamespace: the broker is one the demo does not own (BROKER_URL),
	// so the run works in a namespace of its own and deletes it at Close.
	ownNamespace bool
	namespace    string // the broker namespace ("": the default one)
	reg          *prometheus.Registry
	tracing      *telemetry.Tracing // a no-op one unless OTEL_* ask for an exporter
	appRole      string             // the role the services connect as ("": the database URL's user)

	notifier *outbox.Notifier
	orders   *orderWorkload
	relays   []*outbox.Relay
	consumer *inbox.Consumer

	payments   *paymentsPart
	idp        *devoidc.Server
	console    *web.App
	ConsoleURL string
	// anchorFile holds the signed audit anchors; the key is generated and
	// lives only in this process, as AUDIT_SIGNING_KEY would outside it.
	anchorFile, anchorVerifyKey string

	cancel context.CancelFunc
	wg     sync.WaitGroup
	errs   chan error
}

// Start brings every part up. On error whatever was started is removed.
func Start(ctx context.Context, cfg config.Demo, out io.Writer, log *slog.Logger) (_ *Demo, err error) {
	d := &Demo{cfg: cfg, out: out, log: log, reg: prometheus.NewRegistry(), errs: make(chan error, 16)}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	step := func(format string, args ...any) { fmt.Fprintf(out, "· "+format+"\n", args...) }
	if d.tracing, err = telemetry.Start(ctx, cfg.Telemetry.Config, "sluice-demo"); err != nil {
		return nil, err
	}
	if cfg.Telemetry.Enabled() {
		step("tracing on: spans are exported over OTLP/HTTP")
	}

	if cfg.DatabaseURL == "" {
		step("starting a throwaway PostgreSQL cluster")
	} else {
		step("creating a demo database on DATABASE_URL")
	}
	if d.db, err = openDatabase(ctx, cfg.DatabaseURL); err != nil {
		return nil, err
	}
	owner, err := db.Open(ctx, d.db.URL())
	if err != nil {
		return nil, err
	}
	defer owner.Close()
	if _, err = db.Migrate(ctx, owner); err != nil {
		return nil, err
	}
	if _, err = owner.Exec(ctx, ordersTable); err != nil {
		return nil, fmt.Errorf("demo_order table: %w", err)
	}
	d.appURL = d.db.URL()
	step("database ready, schema at version %d", db.LatestVersion())
	if d.db.cluster != nil {
		// As in production, the services connect as an application role that
		// owns nothing and may only INSERT and SELECT the audit trail and the
		// ledger (db.Grant). The demo owns the throwaway cluster, so it can
		// create that role; on DATABASE_URL they connect as its user.
		if d.appURL, err = asApplicationRole(ctx, owner, d.db.URL()); err != nil {
			return nil, err
		}
		d.appRole = demoAppRole
		step("services connect as the application role %s (owns nothing; INSERT and SELECT only on audit_event and ledger_entry)", demoAppRole)
	}
	owner.Close()
	if d.pool, err = d.openPool(ctx, "demo", 0); err != nil {
		return nil, err
	}

	brokerURL := cfg.BrokerURL
	if brokerURL == "" {
		if d.natsDir, err = os.MkdirTemp("", "sluice-nats-"); err != nil {
			return nil, err
		}
		if d.nats, err = natsembedded.Start(d.natsDir); err != nil {
			return nil, err
		}
		brokerURL = d.nats.ClientURL()
		step("embedded NATS JetStream at %s", brokerURL)
	}
	opts := broker.Options{Logger: log}
	if cfg.BrokerURL != "" {
		// A broker the demo does not own outlives the run: in the default
		// namespace a second run's consumer read the first run's leftover
		// messages, whose order ids start at 1 again, and its inbox then
		// dropped the new run's own events as stale. Each run gets its own
		// exchange or stream, deleted at Close.
		opts.Namespace, d.ownNamespace = "sluice-demo-"+randomHex(4), true
		d.namespace = opts.Namespace
		shown := "(unreadable URL)"
		if u, err := url.Parse(brokerURL); err == nil {
			shown = u.Redacted() // its password stays out of the terminal
		}
		step("broker %s, namespace %s (deleted when the demo stops)", shown, opts.Namespace)
	}
	// One connection per relay and one for the consumer, as separate
	// processes would have.
	openBroker := func(o broker.Options) (broker.Broker, error) {
		b, err := brokerurl.Open(ctx, brokerURL, o)
		if err == nil {
			d.brokers = append(d.brokers, b)
		}
		return b, err
	}

	d.notifier = outbox.NewNotifier(d.pool, 0, log)
	ordersPool, err := d.openPool(ctx, "order workload", 0)
	if err != nil {
		return nil, err
	}
	d.orders = newOrderWorkload(ordersPool, cfg.EventRate, d.notifier.Poke, log)
	for i := range cfg.Relays {
		b, err := openBroker(opts)
		if err != nil {
			return nil, err
		}
		// Few attempts and short backoff, so a refused event reaches the
		// dead letters within a minute of the demo's start.
		name := fmt.Sprintf("relay-%d", i+1)
		pool, err := d.openPool(ctx, name, 0)
		if err != nil {
			return nil, err
		}
		r, err := outbox.NewRelay(pool, newPoisonPublisher(b), outbox.RelayConfig{
			Name:        name,
			MaxAttempts: relayMaxAttempts,
			Backoff:     outbox.Backoff{Cap: 10 * time.Second},
			Tracing:     d.tracing.Provider(),
		}, log, d.reg)
		if err != nil {
			return nil, err
		}
		d.relays = append(d.relays, r)
	}
	// The consumer rides out any outage, as the relays do: after the
	// default ten failed tries (about two minutes) it gave up, and the
	// demo stopped with it.
	subOpts := opts
	subOpts.MaxConsumeFailures = -1
	sub, err := openBroker(subOpts)
	if err != nil {
		return nil, err
	}
	consumerPool, err := d.openPool(ctx, "consumer", 0)
	if err != nil {
		return nil, err
	}
	in, err := inbox.Open(consumerPool, inbox.WithMetrics(d.reg), inbox.WithLogger(log))
	if err != nil {
		return nil, err
	}
	d.consumer = &inbox.Consumer{Inbox: in, Name: consumerName, Tracing: d.tracing.Provider()}

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.cancel = cancel
	d.goRun("notifier", func() error { return d.notifier.Run(runCtx) })
	d.goRun("order workload", func() error { return d.orders.run(runCtx) })
	for _, r := range d.relays {
		d.goRun(r.Config().Name, func() error { return r.Run(runCtx) })
	}
	d.goRun("consumer", func() error {
		return d.consumer.Run(runCtx, redeliveringSubscriber{Subscriber: sub, share: redeliveryShare})
	})
	step("%d relays, the consumer %q and an order workload of %d transactions/s are running", len(d.relays), consumerName, cfg.EventRate)

	if err = d.startPayments(runCtx); err != nil {
		return nil, err
	}
	step("payments service at %s, simulated provider at %s (declines, slow answers, outages, charges that time out → unknown), %d payments/s",
		d.payments.url, d.payments.sim.URL(), cfg.PaymentRate)

	if d.ConsoleURL, err = d.startConsole(runCtx); err != nil {
		return nil, err
	}
	d.goRun("console", func() error { return d.console.Run(runCtx) })
	if err = d.startAnchors(runCtx); err != nil {
		return nil, err
	}
	step("signed audit anchors every %s in %s (AUDIT_VERIFY_KEY=%s)", anchorEvery, d.anchorFile, d.anchorVerifyKey)
	d.banner()
	return d, nil
}

// banner tells a newcomer what to open, who to sign in as, and what the
// demo does on purpose, so its dead letters and unknown payments read as the
// show rather than as a broken install.
func (d *Demo) banner() {
	out := d.out
	fmt.Fprintf(out, "\nSluice console: %s  (open it in a browser: the live dashboard)\n\nSign in on the development provider's page as (password = user name):\n", d.ConsoleURL)
	for _, u := range devoidc.DemoUsers {
		fmt.Fprintf(out, "  %-8s %s\n", u.Username, roleOf(u.Group))
	}
	dbURL, hidden := withoutPassword(d.db.URL())
	fmt.Fprintf(out, "\nDemo database: %s\n  while the demo runs, check its audit chain with: console audit verify --database-url '%s'\n", dbURL, dbURL)
	if hidden {
		fmt.Fprintln(out, "  (its password is left out: give it as PGPASSWORD)")
	}
	fmt.Fprintf(out, `
On purpose, so there is something to look at:
  · about 1 order event in %d is refused by the broker; after %d attempts it becomes a dead letter
    (each one is also logged on stderr as "outbox: event dead-lettered")
  · the simulated provider declines, is slow, is briefly down, and sometimes charges without answering:
    those payments are "unknown"; most are settled by inquiries within minutes, some stay unknown
  · about %.0f%% of deliveries reach the consumer twice; its inbox absorbs the duplicates

Try the payments API yourself (the provider's faults apply; repeat it: same key, same answer, Idempotent-Replayed: true):
  curl -i -X POST %s/v1/payments -H 'Idempotency-Key: try-1' -H 'Authorization: Bearer %s' \
    -d '{"invoice_id":"inv-try-1","account_id":1001,"amount":"12.50","currency":"TRY","customer":{"name":"Ada","email":"ada@example.com","tax_id":"123"}}'

A status line follows every %s. Ctrl-C stops everything and removes what the demo created.
`, poisonOneIn, relayMaxAttempts, redeliveryShare*100, d.payments.url, d.payments.apiKey, d.cfg.StatusEvery)
}

// withoutPassword is a database URL fit to print: the password, if any, is
// left out (not masked), so the URL still works with PGPASSWORD set.
func withoutPassword(raw string) (string, bool) {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw, false
	}
	if _, has := u.User.Password(); !has {
		return raw, false
	}
	u.User = url.User(u.User.Username())
	return u.String(), true
}

// goRun runs a part until the demo stops; a part that fails stops the demo.
func (d *Demo) goRun(name string, fn func() error) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := fn(); err != nil && !errors.Is(err, context.Canceled) {
			select {
			case d.errs <- fmt.Errorf("%s: %w", name, err):
			default:
			}
		}
	}()
}

// Run prints a status line every StatusEvery until ctx ends or a part fails.
func (d *Demo) Run(ctx context.Context) error {
	tick := time.NewTicker(d.cfg.StatusEvery)
	defer tick.Stop()
	last, lastAt := d.published(), time.Now()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(d.out, "· stopping")
			return nil
		case err := <-d.errs:
			return err
		case <-tick.C:
		}
		pub, now := d.published(), time.Now()
		rate := float64(pub-last) / now.Sub(lastAt).Seconds()
		last, lastAt = pub, now
		// A status line the database cannot answer says so, and the demo
		// goes on: the parts ride out an outage, and the status line
		// stopped the demo (and removed its database) at the first one.
		b, err := outbox.ReadBacklog(ctx, d.pool)
		var ps string
		if err == nil {
			ps, err = d.payments.status(ctx)
		}
		if err != nil {
			if ctx.Err() == nil {
				fmt.Fprintf(d.out, "%s  the database does not answer the status line (the parts retry by themselves): %s\n", now.Format("15:04:05"), oneLine(err))
			}
			continue
		}
		c := d.consumer.Counts()
		fmt.Fprintf(d.out, "%s  outbox: backlog %d, in flight %d, dead %d, published %.0f/s%s | consumer: applied %d, duplicates absorbed %d | %s\n",
			now.Format("15:04:05"), b.Pending, b.InFlight, b.Dead, rate, d.pausedNote(), c.Applied, c.Duplicates, ps)
	}
}

// pausedNote says when relays wait for the broker (an outage, a memory
// alarm): "published 0/s" alone did not say why.
func (d *Demo) pausedNote() string {
	paused := 0
	for _, r := range d.relays {
		if r.Paused() {
			paused++
		}
	}
	if paused == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d of %d relays paused: the broker is unavailable)", paused, len(d.relays))
}

func (d *Demo) published() int64 {
	var n int64
	for _, r := range d.relays {
		n += r.Stats().Published
	}
	return n
}

// Close stops every part and removes what the demo created: the throwaway
// cluster or the demo database, and the NATS store.
func (d *Demo) Close() error {
	if d.cancel != nil {
		d.cancel()
	}
	var errs []error
	if d.console != nil {
		errs = append(errs, d.console.Close())
	}
	if d.payments != nil {
		errs = append(errs, d.payments.close())
	}
	d.wg.Wait()
	if d.idp != nil {
		errs = append(errs, d.idp.Close())
	}
	if d.ownNamespace && len(d.brokers) > 0 {
		errs = append(errs, deleteNamespace(d.brokers[0]))
	}
	for _, b := range d.brokers {
		errs = append(errs, b.Close())
	}
	if d.tracing != nil {
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs = append(errs, d.tracing.Close(fctx))
		cancel()
	}
	if d.nats != nil {
		d.nats.Shutdown()
	}
	if d.natsDir != "" {
		errs = append(errs, os.RemoveAll(d.natsDir))
	}
	if d.anchorFile != "" {
		errs = append(errs, os.RemoveAll(filepath.Dir(d.anchorFile)))
	}
	for _, p := range d.pools {
		p.Close()
	}
	if d.db != nil {
		errs = append(errs, d.db.close())
	}
	err := errors.Join(errs...)
	if err == nil && d.cancel != nil {
		// Ctrl-C ends the status lines with "stopping"; say when it is done,
		// so nobody wonders whether a cluster was left behind.
		what := "the throwaway PostgreSQL cluster"
		if d.cfg.DatabaseURL != "" {
			what = "the demo database"
		}
		if d.natsDir != "" {
			what += " and the NATS store"
		}
		fmt.Fprintf(d.out, "· stopped; removed %s\n", what)
	}
	return err
}

// roleOf names a demo group's console role, for the start-up banner. It
// promises no screen or action: a role's powers are listed here when the
// console has the pages that back them (STYLE.md 18).
func roleOf(group string) string {
	switch group {
	case "support":
		return "viewer"
	case "oncall":
		return "operator"
	case "audit":
		return "auditor"
	case "sre":
		return "admin"
	}
	return ""
}

// deleteNamespace removes what the run declared on a broker it does not
// own: RabbitMQ's exchange and the consumer's queue, NATS's stream.
func deleteNamespace(b broker.Broker) error {
	switch b := b.(type) {
	case *rabbitbroker.RabbitMQ:
		return b.DeleteNamespace(consumerName)
	case *natsbroker.JetStream:
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return b.DeleteStream(ctx)
	}
	return nil
}

// randomHex is n random bytes in hex, for a run's own names.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = crand.Read(b) // crypto/rand never fails on the platforms Go supports
	return hex.EncodeToString(b)
}

// oneLine is err's text on one line, for the status line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
