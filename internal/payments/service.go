package payments

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/payments/provider"
	"github.com/sluice-dev/sluice/internal/pii"
)

// Config tunes the service. Zero values take the defaults.
type Config struct {
	Topic             string        // outbox topic of payment.* events (sluice.payments)
	Lease             time.Duration // processing lease; must exceed the provider timeout (30s)
	RetryWindow       time.Duration // how long a key is remembered (72h)
	MaxBodyBytes      int64         // request body limit (16 KiB)
	RecoveryInterval  time.Duration // how often expired leases are looked for (5s)
	ReconcileInterval time.Duration // how often unknown payments are inquired (5s)
	InquiryBackoff    time.Duration // first wait between inquiries of one unknown payment (5s)
	InquiryBackoffMax time.Duration // longest wait (10m)
	ExpiryInterval    time.Duration // how often expired keys are pruned (1m)
	ExpiryBatch       int           // rows per pruning statement (1000)
	Batch             int           // rows per recovery / reconcile pass (100)
	RetryAfterSeconds int           // Retry-After on 409 in progress (1)
	Now               func() time.Time
}

func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if c.Topic == "" {
		c.Topic = DefaultTopic
	}
	def(&c.Lease, 30*time.Second)
	def(&c.RetryWindow, 72*time.Hour)
	def(&c.RecoveryInterval, 5*time.Second)
	def(&c.ReconcileInterval, 5*time.Second)
	def(&c.InquiryBackoff, 5*time.Second)
	def(&c.InquiryBackoffMax, 10*time.Minute)
	def(&c.ExpiryInterval, time.Minute)
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 16 << 10
	}
	if c.ExpiryBatch <= 0 {
		c.ExpiryBatch = 1000
	}
	if c.Batch <= 0 {
		c.Batch = 100
	}
	if c.RetryAfterSeconds <= 0 {
		c.RetryAfterSeconds = 1
	}
	return c
}

// dbClock is the local clock corrected by its measured offset from the
// database's clock, so leases written by services on several hosts compare
// on one time line even when the hosts' clocks drift.
type dbClock struct{ offset atomic.Int64 }

func (c *dbClock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

// sync measures the offset (half the round trip is the error bound).
func (c *dbClock) sync(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	before := time.Now()
	var dbNow time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&dbNow); err != nil {
		return 0, err
	}
	after := time.Now()
	local := before.Add(after.Sub(before) / 2)
	c.offset.Store(int64(dbNow.Sub(local)))
	return 0, nil
}

// Service is the payments service: API handlers and workers over one pool.
type Service struct {
	pool *pgxpool.Pool
	prov provider.Provider
	kr   *pii.Keyring
	cfg  Config
	log  *slog.Logger
	m    *metrics
	clk  *dbClock // nil when the configuration injects Now

	// afterOwnership and afterReserve let tests stop the flow at the worst
	// moments (a crash right after a commit); nil in production.
	afterOwnership func(Record) error
	afterReserve   func(Payment) error
}

// NewService builds the service. reg receives the metrics (nil: none).
func NewService(pool *pgxpool.Pool, prov provider.Provider, kr *pii.Keyring, cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Service, error) {
	if pool == nil || prov == nil || kr == nil {
		return nil, errors.New("payments: pool, provider and keyring are required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg = cfg.withDefaults()
	var clk *dbClock
	if cfg.Now == nil {
		clk = &dbClock{}
		cfg.Now = clk.Now
	}
	return &Service{pool: pool, prov: prov, kr: kr, cfg: cfg, log: log, m: newMetrics(reg), clk: clk}, nil
}

func (s *Service) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }

func (s *Service) charge(ctx context.Context, req provider.ChargeRequest) (provider.Result, error) {
	start := time.Now()
	res, err := s.prov.Charge(ctx, req)
	s.m.providerCall.WithLabelValues("charge").Observe(time.Since(start).Seconds())
	return res, err
}

func (s *Service) inquire(ctx context.Context, p Payment) (provider.Result, error) {
	start := time.Now()
	res, err := s.prov.Inquire(ctx, p.OperationID)
	s.m.providerCall.WithLabelValues("inquire").Observe(time.Since(start).Seconds())
	return res, err
}
