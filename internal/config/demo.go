package config

import (
	"io"
	"time"
)

// Demo configures `console demo`. Every address defaults to loopback.
type Demo struct {
	DatabaseURL  string // empty: a throwaway cluster
	BrokerURL    string // empty: embedded NATS JetStream
	ConsoleAddr  string
	PublicURL    string
	PaymentsAddr string
	ProviderAddr string
	Relays       int
	EventRate    int
	PaymentRate  int
	StatusEvery  time.Duration
	LogLevel     string
}

// ParseDemo reads the demo's flags and environment.
func ParseDemo(args []string, lookup Lookup, out io.Writer) (Demo, error) {
	var c Demo
	f := NewFlags("demo", "Run the whole system on this machine: a throwaway PostgreSQL (or a database of its own on\nDATABASE_URL), embedded NATS JetStream, the development OIDC provider, the payments service with a\nfaulty simulated provider, workloads, relays, the consumer and the console. Ctrl-C stops everything\nand removes what it created.", lookup, out)
	f.String(&c.DatabaseURL, "database-url", "DATABASE_URL", "", "PostgreSQL server to create the demo database on (default: a throwaway cluster)")
	f.String(&c.BrokerURL, "broker-url", "BROKER_URL", "", "nats:// or amqp:// broker (default: embedded NATS JetStream)")
	f.String(&c.ConsoleAddr, "console-addr", "CONSOLE_ADDR", "127.0.0.1:8080", "console listen address")
	f.String(&c.PublicURL, "public-url", "CONSOLE_PUBLIC_URL", "", "console external URL (default: http://CONSOLE_ADDR)")
	f.String(&c.PaymentsAddr, "payments-addr", "PAYMENTS_API_ADDR", "127.0.0.1:8081", "payments service listen address")
	f.String(&c.ProviderAddr, "provider-addr", "PROVIDER_SIM_ADDR", "127.0.0.1:8082", "simulated provider listen address")
	f.Int(&c.Relays, "relays", "DEMO_RELAYS", 2, "outbox relays to run")
	f.Int(&c.EventRate, "event-rate", "DEMO_EVENT_RATE", 40, "order transactions per second (each writes one outbox event)")
	f.Int(&c.PaymentRate, "payment-rate", "DEMO_PAYMENT_RATE", 4, "payment requests per second")
	f.Duration(&c.StatusEvery, "status-every", "DEMO_STATUS_EVERY", 5*time.Second, "how often to print a status line")
	f.String(&c.LogLevel, "log-level", "LOG_LEVEL", "error", "debug, info, warn or error for the JSON log on stderr (status lines go to stdout regardless)")
	if err := f.Parse(args); err != nil {
		return c, err
	}
	if c.PublicURL == "" {
		c.PublicURL = "http://" + c.ConsoleAddr
	}
	var ck Check
	if c.DatabaseURL != "" {
		ck.DatabaseURL("DATABASE_URL", c.DatabaseURL)
	}
	ck.URL("BROKER_URL", c.BrokerURL, "nats", "amqp", "amqps")
	ck.Addr("CONSOLE_ADDR", c.ConsoleAddr)
	ck.URL("CONSOLE_PUBLIC_URL", c.PublicURL, "http", "https")
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
	if _, err := ParseLevel(c.LogLevel); err != nil {
		ck.Failf("LOG_LEVEL: %v", err)
	}
	return c, ck.Err()
}
