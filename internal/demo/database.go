// Package demo runs the whole system on one machine: a throwaway PostgreSQL
// (or a database of its own on DATABASE_URL), embedded NATS JetStream, the
// development OIDC provider, workloads, relays, the consumer, the payments
// service with a faulty simulated provider, and the console. Everything it
// creates it removes at exit.
package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/db"
)

// database is where the demo keeps its data, and how to remove it.
type database struct {
	url     string
	cluster *db.Cluster // nil when the demo created a database on DATABASE_URL
	dropURL string      // maintenance connection used to drop the demo database
	name    string
}

// openDatabase starts a throwaway cluster when serverURL is empty; otherwise
// it creates a new database of its own on that server, so the demo never
// touches data it did not create.
func openDatabase(ctx context.Context, serverURL string) (*database, error) {
	if serverURL == "" {
		c, err := db.StartCluster(ctx)
		if err != nil {
			return nil, fmt.Errorf("throwaway PostgreSQL: %w", err)
		}
		return &database{url: c.URL(), cluster: c}, nil
	}
	// Check the form before creating anything, so a refusal leaves nothing behind.
	u, err := url.Parse(serverURL)
	if err != nil || u.Scheme == "" {
		return nil, fmt.Errorf("DATABASE_URL: the demo needs the URL form (postgres://user@host:port/db)")
	}
	cfg, err := pgx.ParseConfig(serverURL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: connect: %w", err)
	}
	defer conn.Close(ctx)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "sluice_demo_" + hex.EncodeToString(b)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, fmt.Errorf("create demo database on DATABASE_URL: %w", err)
	}
	u.Path = "/" + name
	return &database{url: u.String(), dropURL: serverURL, name: name}, nil
}

// URL of the demo database.
func (d *database) URL() string { return d.url }

func (d *database) close() error {
	if d.cluster != nil {
		return d.cluster.Stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, d.dropURL)
	if err != nil {
		return fmt.Errorf("drop demo database: %w", err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+d.name+" WITH (FORCE)")
	return err
}

// demoAppRole is the role the demo's services connect as on its throwaway
// cluster.
const demoAppRole = "sluice_app"

// asApplicationRole grants demoAppRole what the services need (db.Grant:
// creating the role, which the cluster's superuser may) and returns the URL
// that connects as the role. The throwaway cluster trusts loopback
// connections, so the role needs no password.
func asApplicationRole(ctx context.Context, owner *pgxpool.Pool, ownerURL string) (string, error) {
	if _, err := db.Grant(ctx, owner, demoAppRole); err != nil {
		return "", fmt.Errorf("application role: %w", err)
	}
	u, err := url.Parse(ownerURL)
	if err != nil {
		return "", err
	}
	u.User = url.User(demoAppRole)
	return u.String(), nil
}

// openPool connects one part of the demo: each part has a pool of its own,
// as the separate processes of a deployment have, named in
// pg_stat_activity (application_name "sluice-demo <part>"). With one pool
// for all, payments waiting on a locked account took every connection,
// and every console page, the relays and the consumer waited behind them
// (an outage drill held an account lock for 30 s: pages took 26 s).
// maxConns sizes it (0: pgx's default, as the console and relay commands).
func (d *Demo) openPool(ctx context.Context, part string, maxConns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(d.appURL)
	if err != nil {
		return nil, err
	}
	if maxConns > 0 {
		cfg.MaxConns = int32(maxConns)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "sluice-demo " + part
	p, err := db.OpenConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", part, err)
	}
	d.pools = append(d.pools, p)
	return p, nil
}
