package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"strings"

	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/demo/devoidc"
	"github.com/sluice-dev/sluice/web"
)

// demoFourEyesAbove is CONSOLE_FOUR_EYES_ABOVE in the demo: about half the
// workload's payments exceed it.
var demoFourEyesAbove = decimal.New(250, 0)

// startConsole starts the development OpenID Provider (loopback only) and
// the console signed in through it, with the demo users' groups mapped to
// the four roles. It returns the console's URL.
func (d *Demo) startConsole(ctx context.Context) (string, error) {
	ln, err := net.Listen("tcp", d.cfg.ConsoleAddr)
	if err != nil {
		return "", fmt.Errorf("CONSOLE_ADDR %s: %w (is another console running? set --console-addr)", d.cfg.ConsoleAddr, err)
	}
	base := strings.TrimSuffix(d.cfg.PublicURL, "/")
	if base == "http://"+d.cfg.ConsoleAddr {
		base = "http://" + ln.Addr().String() // port 0 picked a port
	}
	secret := make([]byte, 16)
	_, _ = rand.Read(secret)
	clientID, clientSecret := "sluice-console", hex.EncodeToString(secret)
	idp, err := devoidc.Start(ctx, devoidc.Config{
		Addr:           "127.0.0.1:0",
		ClientID:       clientID,
		ClientSecret:   clientSecret,
		RedirectURIs:   []string{base + "/auth/callback"},
		PostLogoutURIs: []string{base + "/signed-out"},
	})
	if err != nil {
		ln.Close()
		return "", err
	}
	d.idp = idp
	roles, err := auth.ParseRoleMap(devoidc.DemoRoleMap)
	if err != nil {
		ln.Close()
		return "", err
	}
	// The console shares the demo's metrics registry (Registry below), but
	// its gauges come from its own snapshot, not from the services it
	// watches: the payments service leaves its health gauges to it
	// (HealthGaugesElsewhere).
	pool, err := d.openPool(ctx, "console", 0)
	if err != nil {
		return "", err
	}
	app, err := web.New(ctx, web.Config{
		PublicURL:        base,
		OIDCIssuer:       idp.Issuer(),
		OIDCClientID:     clientID,
		OIDCClientSecret: clientSecret,
		RolesClaim:       devoidc.RolesClaim,
		RoleMap:          roles,
		// Demo payments are 1..500: resolving one above 250 needs a second
		// operator, so both paths can be tried.
		FourEyesAbove:   demoFourEyesAbove,
		ProviderURL:     d.payments.sim.URL(),
		ProviderTimeout: demoProviderTimeout,
		TraceURL:        d.cfg.TraceURL,
	}, web.Deps{Pool: pool, Logger: d.log, Listener: ln, Tracing: d.tracing.Provider(),
		// One process, one /metrics: the console serves what the relays,
		// the consumer and the payments service registered too.
		Registry: d.reg,
		// The demo's keys, so an operator can try a reveal (with a reason).
		Keyring: d.payments.kr})
	if err != nil {
		ln.Close()
		return "", err
	}
	d.console = app
	return base, nil
}
