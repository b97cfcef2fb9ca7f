package config

import (
	"io"
	"strings"
	"testing"
)

func TestPaymentsAPIConfig(t *testing.T) {
	t.Parallel()
	base := map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1/db", "PII_KEYS": testPIIKeys, "PII_BLIND_INDEX_KEY": testBlindKey}
	parse := func(env map[string]string, args ...string) (PaymentsAPI, error) {
		var c PaymentsAPI
		f := NewFlags("payments-api", "", MapLookup(env), io.Discard)
		c.Register(f)
		if err := f.Parse(args); err != nil {
			return c, err
		}
		return c, c.Validate()
	}
	c, err := parse(base)
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != "127.0.0.1:8081" || c.RetryWindow.Hours() != 72 || c.Topic != "sluice.payments" || c.PoolSize != 8 || len(c.HostList()) != 0 {
		t.Fatalf("defaults: %+v", c)
	}
	withHosts := map[string]string{"PAYMENTS_API_HOSTS": " pay.example.com, api.example.com:443 ,", "PAYMENTS_DB_POOL_SIZE": "64"}
	for k, v := range base {
		withHosts[k] = v
	}
	c, err = parse(withHosts, "--addr", "0.0.0.0:8081")
	if err != nil || c.PoolSize != 64 || strings.Join(c.HostList(), "|") != "pay.example.com|api.example.com:443" {
		t.Fatalf("hosts and pool size: %+v %v", c, err)
	}
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{"DATABASE_URL": "postgres://u@h/db"}, nil, "PII_KEYS"},
		{base, []string{"--lease", "1s", "--provider-timeout", "5s"}, "PAYMENTS_LEASE"},
		{base, []string{"--provider-url", "ftp://x"}, "PROVIDER_URL"},
		{base, []string{"--addr", "nope"}, "PAYMENTS_API_ADDR"},
		{base, []string{"--db-pool-size", "0"}, "PAYMENTS_DB_POOL_SIZE"},
		{base, []string{"--addr", "0.0.0.0:8081"}, "PAYMENTS_API_HOSTS"},
		{base, []string{"--hosts", "http://x/"}, "PAYMENTS_API_HOSTS"},
		{base, []string{"--metrics-addr", "nope"}, "METRICS_ADDR"},
	} {
		_, err := parse(tc.env, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: err = %v, want one naming %s", tc.env, tc.args, err, tc.want)
		}
	}
}

func TestProviderSimConfig(t *testing.T) {
	t.Parallel()
	var c ProviderSim
	f := NewFlags("provider-sim", "", MapLookup(map[string]string{"PROVIDER_SIM_DOWN_RATE": "0.02"}), io.Discard)
	c.Register(f)
	if err := f.Parse([]string{"--decline-rate", "0.1", "--timeout-after-charge-rate", "0.05"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.DeclineRate != 0.1 || c.DownRate != 0.02 || c.TimeoutAfterChargeRate != 0.05 || c.Addr != "127.0.0.1:8082" {
		t.Fatalf("parsed: %+v", c)
	}
	for _, args := range [][]string{{"--slow-rate", "1.5"}, {"--decline-rate", "x"}, {"--decline-rate", "0.6", "--slow-rate", "0.6"}} {
		var c ProviderSim
		f := NewFlags("provider-sim", "", MapLookup(nil), io.Discard)
		c.Register(f)
		if err := f.Parse(args); err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "PROVIDER_SIM_") {
			t.Errorf("%v: err = %v", args, err)
		}
	}
}
