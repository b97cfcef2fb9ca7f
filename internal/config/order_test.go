package config

import (
	"io"
	"strings"
	"testing"
)

// validator is every subcommand's config: Register, Parse, Validate.
type validator interface {
	Register(f *Flags)
	Validate() error
}

// With several settings wrong at once, start-up names the same one first
// every time: checks run in a fixed order, never over a map.
func TestFirstValidationErrorIsAlwaysTheSame(t *testing.T) {
	t.Parallel()
	zeroDurations := map[string]string{
		"DATABASE_URL": "postgres://u@127.0.0.1/db", "PII_KEYS": testPIIKeys, "PII_BLIND_INDEX_KEY": testBlindKey,
		"PROVIDER_TIMEOUT": "0s", "PAYMENTS_LEASE": "0s", "PAYMENTS_RETRY_WINDOW": "0s",
		"PAYMENTS_RECOVERY_INTERVAL": "0s", "PAYMENTS_RECONCILE_INTERVAL": "0s", "PAYMENTS_INQUIRY_BACKOFF": "0s",
		"PAYMENTS_INQUIRY_BACKOFF_MAX": "0s", "PAYMENTS_EXPIRY_INTERVAL": "0s",
	}
	for _, tc := range []struct {
		name string
		cfg  func() validator
		env  map[string]string
		want string // the first error names this
	}{
		{"payments-api durations", func() validator { return &PaymentsAPI{} }, zeroDurations, "PROVIDER_TIMEOUT"},
		{"payments-api everything", func() validator { return &PaymentsAPI{} },
			map[string]string{"LOG_LEVEL": "loud", "PAYMENTS_API_ADDR": "nope", "PAYMENTS_LEASE": "0s"}, "DATABASE_URL"},
		{"serve", func() validator { return &Console{} },
			map[string]string{"DATABASE_URL": "postgres://u@h/db", "CONSOLE_PUBLIC_URL": "http://console.example.com", "OIDC_ISSUER": "http://idp.example.com", "CONSOLE_WS_PER_SESSION": "0"}, "CONSOLE_PUBLIC_URL"},
		{"relay", func() validator { return &Relay{} },
			map[string]string{"DATABASE_URL": "postgres://u@h/db", "RELAY_BATCH_SIZE": "0", "RELAY_LEASE": "0s", "RELAY_MAX_ATTEMPTS": "0"}, "BROKER_URL"},
		{"consume", func() validator { return &Consume{} },
			map[string]string{"BROKER_URL": "kafka://x:1", "CONSUMER_NAME": "a.b"}, "DATABASE_URL"},
		{"prune", func() validator { return &Prune{} },
			map[string]string{"DATABASE_URL": "postgres://u@h/db", "OUTBOX_RETENTION": "0s", "INBOX_RETENTION": "0s", "PRUNE_BATCH_SIZE": "0"}, "OUTBOX_RETENTION"},
		{"demo", func() validator { return &Demo{} },
			map[string]string{"BROKER_URL": "kafka://x:1", "DEMO_RELAYS": "0", "DEMO_STATUS_EVERY": "0s", "LOG_LEVEL": "loud"}, "BROKER_URL"},
		{"provider-sim", func() validator { return &ProviderSim{} },
			map[string]string{"PROVIDER_SIM_DECLINE_RATE": "2", "PROVIDER_SIM_SLOW_RATE": "x", "PROVIDER_SIM_HANG_FOR": "0s"}, "PROVIDER_SIM_DECLINE_RATE"},
		{"payments reconcile", func() validator { return &PaymentsReconcile{} },
			map[string]string{"PAYMENTS_TOPIC": " "}, "DATABASE_URL"},
	} {
		var first string
		for i := range 50 {
			c := tc.cfg()
			f := NewFlags(tc.name, "", MapLookup(tc.env), io.Discard)
			c.Register(f)
			if err := f.Parse(nil); err != nil {
				t.Fatalf("%s: parse: %v", tc.name, err)
			}
			err := c.Validate()
			if err == nil {
				t.Fatalf("%s: no error, want several", tc.name)
			}
			if i == 0 {
				first = err.Error()
				if !strings.HasPrefix(first, tc.want) {
					t.Errorf("%s: first error %q, want one naming %s", tc.name, first, tc.want)
				}
			} else if err.Error() != first {
				t.Fatalf("%s: run %d reported %q first, run 0 %q", tc.name, i, err, first)
			}
		}
	}
}
