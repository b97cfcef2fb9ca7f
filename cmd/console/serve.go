package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/web"
)

func runServe(ctx context.Context, e env, args []string) error {
	var c config.Console
	anchors := anchoring{lookup: e.lookup}
	if _, err := configure(e, "serve", "The web console: OIDC sign-in and the live dashboard.", both{&c, &anchors}, args, nil); err != nil {
		return err
	}
	roleMap, err := auth.ParseRoleMap(c.RoleMap)
	if err != nil {
		return fmt.Errorf("CONSOLE_ROLE_MAP: %w", err)
	}
	log := newLogger(e.stderr, c.LogLevel)
	tracing, stopTracing, err := startTracing(ctx, c.Telemetry, "console", log)
	if err != nil {
		return err
	}
	defer stopTracing()
	pool, err := db.OpenCurrent(ctx, c.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer anchors.start(ctx, pool, log)()
	app, err := web.New(ctx, web.Config{
		Addr: c.Addr, PublicURL: strings.TrimSuffix(c.PublicURL, "/"), MetricsAddr: c.MetricsAddr,
		OIDCIssuer: c.OIDCIssuer, OIDCClientID: c.OIDCClientID, OIDCClientSecret: c.OIDCClientSecret,
		RolesClaim: c.RolesClaim, RoleMap: roleMap,
		SessionLifetime: c.SessionLifetime, SessionIdle: c.SessionIdle, Tick: c.Tick,
		OIDCScopes: c.Scopes(), RoleRecheck: c.RoleRecheck,
		ReadHeaderTimeout: c.ReadHeaderTimeout, ReadTimeout: c.ReadTimeout, IdleTimeout: c.IdleTimeout,
		WSPerSession: c.WSPerSession, LoginRate: c.LoginRate, LoginPending: c.LoginPending,
		WarnOldestPending: c.WarnOldestPending, WarnReconcileAge: c.WarnReconcileAge, WarnDead: int64(c.WarnDead),
		BulkRecentLoginAbove: c.BulkRecentLogin, RecentLogin: c.RecentLogin, RevealRoles: c.RevealRoleList,
		FourEyesAbove: decimal.RequireFromString(c.FourEyesAbove), // validated
		ProviderURL:   c.ProviderURL, ProviderTimeout: c.ProviderTimeout,
		TraceURL: c.TraceURL, PaymentsTopic: c.PaymentsTopic,
	}, web.Deps{Pool: pool, Logger: log, Keyring: c.Keyring, Tracing: tracing.Provider()})
	if err != nil {
		return err
	}
	return app.Run(ctx)
}
