package config

import "time"

// Demo configures `console demo`. Every address defaults to loopback, the
// same addresses serve, payments-api and provider-sim use.
type Demo struct {
	DatabaseURL  string // empty: a throwaway cluster
	BrokerURL    string // empty: embedded NATS JetStream
	ConsoleAddr  string
	PublicURL    string // empty: http://ConsoleAddr (Validate fills it in)
	PaymentsAddr string
	ProviderAddr string
	Relays       int
	EventRate    int
	PaymentRate  int
	StatusEvery  time.Duration
	LogLevel     string
	Telemetry    Telemetry
	TraceURL     string // CONSOLE_TRACE_URL
}

// Register adds the demo's flags.
func (c *Demo) Register(f *Flags) {
	registerDatabaseURL(f, &c.DatabaseURL, "PostgreSQL server to create the demo database on (default: a throwaway cluster)")
	f.String(&c.BrokerURL, "broker-url", "BROKER_URL", "", "nats:// or amqp:// broker (default: embedded NATS JetStream)")
	f.String(&c.ConsoleAddr, "console-addr", "CONSOLE_ADDR", DefaultConsoleAddr, "console listen address")
	f.String(&c.PublicURL, "public-url", "CONSOLE_PUBLIC_URL", "", "console external URL (default: http://CONSOLE_ADDR)")
	f.String(&c.PaymentsAddr, "payments-addr", "PAYMENTS_API_ADDR", DefaultPaymentsAPIAddr, "payments service listen address")
	f.String(&c.ProviderAddr, "provider-addr", "PROVIDER_SIM_ADDR", DefaultProviderSimAddr, "simulated provider listen address")
	f.Int(&c.Relays, "relays", "DEMO_RELAYS", 2, "outbox relays to run")
	f.Int(&c.EventRate, "event-rate", "DEMO_EVENT_RATE", 40, "order transactions per second (each writes one outbox event)")
	f.Int(&c.PaymentRate, "payment-rate", "DEMO_PAYMENT_RATE", 4, "payment requests per second")
	f.Duration(&c.StatusEvery, "status-every", "DEMO_STATUS_EVERY", 5*time.Second, "how often to print a status line")
	// The demo's log is quieter than a service's: its status lines say what happens.
	registerLogLevel(f, &c.LogLevel, "error", "debug, info, warn or error for the JSON log on stderr (status lines go to stdout regardless)")
	c.Telemetry.register(f)
	registerTraceURL(f, &c.TraceURL)
}

// Validate checks the settings and derives CONSOLE_PUBLIC_URL from
// CONSOLE_ADDR when it is not set.
func (c *Demo) Validate() error {
	if c.PublicURL == "" {
		c.PublicURL = "http://" + c.ConsoleAddr
	}
	var ck Check
	if c.DatabaseURL != "" {
		ck.DatabaseURL("DATABASE_URL", c.DatabaseURL)
	}
	ck.URL("BROKER_URL", c.BrokerURL, "nats", "amqp", "amqps")
	ck.Addr("CONSOLE_ADDR", c.ConsoleAddr)
	checkPublicURL(&ck, c.PublicURL)
	ck.Addr("PAYMENTS_API_ADDR", c.PaymentsAddr)
	ck.Addr("PROVIDER_SIM_ADDR", c.ProviderAddr)
	ck.Positive("DEMO_RELAYS", c.Relays)
	if c.EventRate < 0 || c.EventRate > 5000 {
		ck.Failf("DEMO_EVENT_RATE must be between 0 and 5000 (got %d)", c.EventRate)
	}
	if c.PaymentRate < 0 || c.PaymentRate > 500 {
		ck.Failf("DEMO_PAYMENT_RATE must be between 0 and 500 (got %d)", c.PaymentRate)
	}
	ck.PositiveDuration("DEMO_STATUS_EVERY", c.StatusEvery)
	checkLogLevel(&ck, c.LogLevel)
	c.Telemetry.check(&ck)
	checkTraceURL(&ck, c.TraceURL)
	return ck.Err()
}
