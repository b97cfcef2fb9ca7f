package config

import (
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/payments/provider"
)

// DefaultPaymentsPoolSize sizes the payments service's database pool. A
// payment holds a connection for one short statement to reserve and one to
// settle, never across the provider call, so a few connections serve many
// clients; more backends than the database server has cores to run them add
// contention, not payments. Bench P1 on 2 cores with 32 clients, interleaved
// runs (bench/README.md, "The payments pool"): 8 connections gave 0.238× of
// pgbench's TPS (median of 8) against 0.211× with 32 (median of 5), at 1.66
// against 2.26 ms of server CPU per payment, and an open-loop p99 of 27
// against 118 ms; 4 left the server waiting between round trips (0.205×), 6
// and 12 were within the runs' spread of 8. A bigger database server wants a
// bigger pool: PAYMENTS_DB_POOL_SIZE.
const DefaultPaymentsPoolSize = 8

// PaymentsAPI configures `console payments-api`: the reference payments
// service and its recovery, reconcile and expiry workers.
type PaymentsAPI struct {
	Common
	Addr            string
	Hosts           string // PAYMENTS_API_HOSTS: extra Host names clients use, comma-separated
	MetricsAddr     string
	PoolSize        int
	ProviderURL     string
	ProviderTimeout time.Duration
	PIIKeys
	Topic             string
	Lease             time.Duration
	RetryWindow       time.Duration
	RecoveryInterval  time.Duration
	ReconcileInterval time.Duration
	InquiryBackoff    time.Duration
	InquiryBackoffMax time.Duration
	ExpiryInterval    time.Duration
}

// Register adds the flags (each with its environment twin).
func (c *PaymentsAPI) Register(f *Flags) {
	c.Common.register(f)
	f.String(&c.Addr, "addr", "PAYMENTS_API_ADDR", DefaultPaymentsAPIAddr, "listen address of the payments API (also serves /metrics)")
	f.String(&c.Hosts, "hosts", "PAYMENTS_API_HOSTS", "", "comma-separated Host names clients use to reach the API besides its listen address (name: any port, name:port: that port); other Host headers get 421 (DNS rebinding defence)")
	f.String(&c.MetricsAddr, "metrics-addr", "METRICS_ADDR", "", "serve /metrics on this host:port instead of on PAYMENTS_API_ADDR")
	f.Int(&c.PoolSize, "db-pool-size", "PAYMENTS_DB_POOL_SIZE", DefaultPaymentsPoolSize, "most database connections the service opens (each request in flight holds one for a few short statements)")
	f.String(&c.ProviderURL, "provider-url", "PROVIDER_URL", "http://"+DefaultProviderSimAddr, "base URL of the payment provider (e.g. `console provider-sim`)")
	f.Duration(&c.ProviderTimeout, "provider-timeout", "PROVIDER_TIMEOUT", provider.DefaultTimeout, "give up on one provider call after this long (the outcome becomes unknown)")
	c.PIIKeys.register(f)
	f.String(&c.Topic, "topic", "PAYMENTS_TOPIC", payments.DefaultTopic, "outbox topic of payment.* events")
	f.Duration(&c.Lease, "lease", "PAYMENTS_LEASE", payments.DefaultLease, "processing lease of a key; recovery takes over after it (must exceed PROVIDER_TIMEOUT)")
	f.Duration(&c.RetryWindow, "retry-window", "PAYMENTS_RETRY_WINDOW", payments.DefaultRetryWindow, "how long an Idempotency-Key is remembered")
	f.Duration(&c.RecoveryInterval, "recovery-interval", "PAYMENTS_RECOVERY_INTERVAL", payments.DefaultRecoveryInterval, "how often expired leases are looked for")
	f.Duration(&c.ReconcileInterval, "reconcile-interval", "PAYMENTS_RECONCILE_INTERVAL", payments.DefaultReconcileInterval, "how often unknown payments due for an inquiry are inquired")
	f.Duration(&c.InquiryBackoff, "inquiry-backoff", "PAYMENTS_INQUIRY_BACKOFF", payments.DefaultInquiryBackoff, "first wait between inquiries of one unknown payment (doubles each time)")
	f.Duration(&c.InquiryBackoffMax, "inquiry-backoff-max", "PAYMENTS_INQUIRY_BACKOFF_MAX", payments.DefaultInquiryBackoffMax, "longest wait between inquiries")
	f.Duration(&c.ExpiryInterval, "expiry-interval", "PAYMENTS_EXPIRY_INTERVAL", payments.DefaultExpiryInterval, "how often expired keys are pruned")
}

// Validate checks the settings; messages name the variable.
func (c *PaymentsAPI) Validate() error {
	var ck Check
	c.Common.check(&ck)
	ck.Required("PAYMENTS_API_ADDR", c.Addr)
	ck.Addr("PAYMENTS_API_ADDR", c.Addr)
	ck.Addr("METRICS_ADDR", c.MetricsAddr)
	if c.PoolSize < 1 || c.PoolSize > 1000 {
		ck.Failf("PAYMENTS_DB_POOL_SIZE must be between 1 and 1000 (got %d)", c.PoolSize)
	}
	for _, h := range c.HostList() {
		if strings.ContainsAny(h, "/ @") {
			ck.Failf("PAYMENTS_API_HOSTS: %q is not a host name or host:port", h)
		}
	}
	if host, _, err := net.SplitHostPort(c.Addr); err == nil && len(c.HostList()) == 0 {
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			ck.Failf("PAYMENTS_API_HOSTS is required when PAYMENTS_API_ADDR listens on all interfaces (%q): name the hosts clients use", c.Addr)
		}
	}
	ck.Required("PROVIDER_URL", c.ProviderURL)
	ck.URL("PROVIDER_URL", c.ProviderURL, "http", "https")
	c.PIIKeys.check(&ck, true)
	ck.Required("PAYMENTS_TOPIC", c.Topic)
	// In flag order, never over a map: the first problem reported must not
	// depend on map iteration order.
	ck.PositiveDuration("PROVIDER_TIMEOUT", c.ProviderTimeout)
	ck.PositiveDuration("PAYMENTS_LEASE", c.Lease)
	ck.PositiveDuration("PAYMENTS_RETRY_WINDOW", c.RetryWindow)
	ck.PositiveDuration("PAYMENTS_RECOVERY_INTERVAL", c.RecoveryInterval)
	ck.PositiveDuration("PAYMENTS_RECONCILE_INTERVAL", c.ReconcileInterval)
	ck.PositiveDuration("PAYMENTS_INQUIRY_BACKOFF", c.InquiryBackoff)
	ck.PositiveDuration("PAYMENTS_INQUIRY_BACKOFF_MAX", c.InquiryBackoffMax)
	ck.PositiveDuration("PAYMENTS_EXPIRY_INTERVAL", c.ExpiryInterval)
	if c.Lease > 0 && c.ProviderTimeout > 0 && c.Lease <= c.ProviderTimeout {
		ck.Failf("PAYMENTS_LEASE (%s) must be longer than PROVIDER_TIMEOUT (%s), or recovery would take over calls still in flight", c.Lease, c.ProviderTimeout)
	}
	return ck.Err()
}

// HostList is PAYMENTS_API_HOSTS split on commas, blanks dropped.
func (c *PaymentsAPI) HostList() []string {
	var out []string
	for _, h := range strings.Split(c.Hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			out = append(out, h)
		}
	}
	return out
}

// ProviderSim configures `console provider-sim`. Rates are probabilities in
// [0,1], given as text (e.g. 0.05) and read by Validate.
type ProviderSim struct {
	Addr     string
	LogLevel string

	DeclineRateText, SlowRateText, TimeoutAfterChargeRateText, DownRateText string
	InquiryUnknownRateText, InquiryStuckRateText                            string

	DeclineRate, SlowRate, TimeoutAfterChargeRate, DownRate float64
	InquiryUnknownRate, InquiryStuckRate                    float64

	SlowDelay time.Duration
	HangFor   time.Duration
}

// Register adds the flags.
func (c *ProviderSim) Register(f *Flags) {
	f.String(&c.Addr, "addr", "PROVIDER_SIM_ADDR", DefaultProviderSimAddr, "listen address of the simulated provider")
	registerLogLevel(f, &c.LogLevel, defaultLogLevel, "debug, info, warn or error")
	f.String(&c.DeclineRateText, "decline-rate", "PROVIDER_SIM_DECLINE_RATE", "0", "share of new charges declined")
	f.String(&c.SlowRateText, "slow-rate", "PROVIDER_SIM_SLOW_RATE", "0", "share of new charges answered after --slow-delay")
	f.String(&c.TimeoutAfterChargeRateText, "timeout-after-charge-rate", "PROVIDER_SIM_TIMEOUT_AFTER_CHARGE_RATE", "0", "share of new charges that move money and then never answer")
	f.String(&c.DownRateText, "down-rate", "PROVIDER_SIM_DOWN_RATE", "0", "share of requests answered 503 without processing")
	f.String(&c.InquiryUnknownRateText, "inquiry-unknown-rate", "PROVIDER_SIM_INQUIRY_UNKNOWN_RATE", "0", "share of inquiries answered \"unknown\"")
	f.String(&c.InquiryStuckRateText, "inquiry-stuck-rate", "PROVIDER_SIM_INQUIRY_STUCK_RATE", "0", "share of operations whose inquiries always answer \"unknown\" (left to an operator)")
	f.Duration(&c.SlowDelay, "slow-delay", "PROVIDER_SIM_SLOW_DELAY", provider.DefaultSlowDelay, "how long a slow charge takes")
	f.Duration(&c.HangFor, "hang-for", "PROVIDER_SIM_HANG_FOR", provider.DefaultHangFor, "longest a timeout-after-charge holds the connection")
}

// Validate reads the rates and checks the settings.
func (c *ProviderSim) Validate() error {
	var ck Check
	ck.Required("PROVIDER_SIM_ADDR", c.Addr)
	ck.Addr("PROVIDER_SIM_ADDR", c.Addr)
	checkLogLevel(&ck, c.LogLevel)
	rate := func(env, text string, dst *float64) {
		v, err := strconv.ParseFloat(strings.TrimSpace(text), 64)
		if err != nil || v < 0 || v > 1 {
			ck.Failf("%s: %q is not a probability between 0 and 1", env, text)
			return
		}
		*dst = v
	}
	rate("PROVIDER_SIM_DECLINE_RATE", c.DeclineRateText, &c.DeclineRate)
	rate("PROVIDER_SIM_SLOW_RATE", c.SlowRateText, &c.SlowRate)
	rate("PROVIDER_SIM_TIMEOUT_AFTER_CHARGE_RATE", c.TimeoutAfterChargeRateText, &c.TimeoutAfterChargeRate)
	rate("PROVIDER_SIM_DOWN_RATE", c.DownRateText, &c.DownRate)
	rate("PROVIDER_SIM_INQUIRY_UNKNOWN_RATE", c.InquiryUnknownRateText, &c.InquiryUnknownRate)
	rate("PROVIDER_SIM_INQUIRY_STUCK_RATE", c.InquiryStuckRateText, &c.InquiryStuckRate)
	if sum := c.DeclineRate + c.SlowRate + c.TimeoutAfterChargeRate + c.DownRate; sum > 1 {
		ck.Failf("PROVIDER_SIM_*_RATE: decline + slow + timeout-after-charge + down add up to %.2f, more than 1", sum)
	}
	ck.PositiveDuration("PROVIDER_SIM_SLOW_DELAY", c.SlowDelay)
	ck.PositiveDuration("PROVIDER_SIM_HANG_FOR", c.HangFor)
	return ck.Err()
}

// PaymentsReconcile configures `console payments reconcile --file F`.
type PaymentsReconcile struct {
	DatabaseURL string
	File        string
	Topic       string
	DryRun      bool
	Actor       string // who applies the file, for the audit rows (empty: the OS user and host)
}

// Register adds the flags.
func (c *PaymentsReconcile) Register(f *Flags) {
	f.String(&c.Actor, "actor", "PAYMENTS_SETTLEMENT_ACTOR", "", "who applies the file, named in the audit row of each line it settles, contradicts or finds no payment for (default: OS user@host)")
	registerDatabaseURL(f, &c.DatabaseURL, "PostgreSQL ≥ 15 connection URL")
	f.String(&c.File, "file", "PAYMENTS_SETTLEMENT_FILE", "", "provider settlement file: CSV operation_id,outcome[,provider_ref] (outcome succeeded|failed); - for stdin")
	f.String(&c.Topic, "topic", "PAYMENTS_TOPIC", payments.DefaultTopic, "outbox topic of payment.* events")
	f.Bool(&c.DryRun, "dry-run", "PAYMENTS_SETTLEMENT_DRY_RUN", false, "print what the file would change and change nothing")
}

// Validate checks the settings.
func (c *PaymentsReconcile) Validate() error {
	var ck Check
	ck.DatabaseURL("DATABASE_URL", c.DatabaseURL)
	if strings.TrimSpace(c.File) == "" {
		ck.Failf("PAYMENTS_SETTLEMENT_FILE (--file) is required")
	}
	ck.Required("PAYMENTS_TOPIC", c.Topic)
	return ck.Err()
}
