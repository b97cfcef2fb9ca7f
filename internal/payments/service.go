package payments

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/payments/provider"
	"github.com/sluice-dev/sluice/internal/pii"
)

// Config tunes the service. Zero values take the defaults.
type Config struct {
	Topic             string        // outbox topic of payment.* events (sluice.payments)
	Lease             time.Duration // processing lease; must exceed the provider timeout (30s)
	RetryWindow       time.Duration // how long a key is remembered (72h)
	RecoveryInterval  time.Duration // how often expired leases are looked for (5s)
	ReconcileInterval time.Duration // how often unknown payments are inquired (5s)
	InquiryBackoff    time.Duration // first wait between inquiries of one unknown payment (5s)
	InquiryBackoffMax time.Duration // longest wait (10m)
	ExpiryInterval    time.Duration // how often expired keys are pruned (1m)
	ExpiryBatch       int           // rows per pruning statement (1000)
	Batch             int           // rows per recovery / reconcile pass (100)
	RetryAfterSeconds int           // Retry-After on 409 in progress (1)
	// Now is the service's clock. Nil means the database clock
	// (statement_timestamp() in each statement), so services on hosts with
	// skewed clocks agree on leases, inquiry times and key expiry; tests
	// inject a clock so leases and backoff expire without sleeping.
	Now func() time.Time
	// Poker is told after every commit that wrote an outbox event, so a
	// sleeping relay publishes it at once (an *outbox.Notifier); nil: the
	// relays find the events on their next poll.
	Poker Poker
	// HealthGaugesElsewhere leaves sluice_payments_unknown,
	// sluice_payments_reconcile_age_seconds and sluice_payments_discrepancies
	// to another part of the same process: the console exports the same
	// numbers from its snapshot, and in `console demo`, where both run and
	// share one /metrics, each number must have one source.
	HealthGaugesElsewhere bool
}

// Poker wakes the relays; *outbox.Notifier is one. Poke must not block.
type Poker interface{ Poke() }

// Defaults of Config, applied to zero fields; the command-line flags of
// `console payments-api` show the same values.
const (
	DefaultLease             = 30 * time.Second
	DefaultRetryWindow       = 72 * time.Hour
	DefaultRecoveryInterval  = 5 * time.Second
	DefaultReconcileInterval = 5 * time.Second
	DefaultInquiryBackoff    = 5 * time.Second
	DefaultInquiryBackoffMax = 10 * time.Minute
	DefaultExpiryInterval    = time.Minute
)

func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if c.Topic == "" {
		c.Topic = DefaultTopic
	}
	def(&c.Lease, DefaultLease)
	def(&c.RetryWindow, DefaultRetryWindow)
	def(&c.RecoveryInterval, DefaultRecoveryInterval)
	def(&c.ReconcileInterval, DefaultReconcileInterval)
	def(&c.InquiryBackoff, DefaultInquiryBackoff)
	def(&c.InquiryBackoffMax, DefaultInquiryBackoffMax)
	def(&c.ExpiryInterval, DefaultExpiryInterval)
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

// Service is the payments service: the operations of the API and the
// workers over one pool (the HTTP transport is package paymentsapi).
type Service struct {
	pool *pgxpool.Pool
	prov provider.Provider
	kr   *pii.Keyring
	cfg  Config
	log  *slog.Logger
	m    *metrics

	// afterOwnership and afterReserve let tests stop the flow at the worst
	// moments (a crash right after a commit); nil in production.
	afterOwnership func(Record) error
	afterPayment   func(Payment) error // reserve's transaction, its payment inserted
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
	m, err := newMetrics(reg, !cfg.HealthGaugesElsewhere)
	if err != nil {
		return nil, fmt.Errorf("payments: metrics: %w", err)
	}
	return &Service{pool: pool, prov: prov, kr: kr, cfg: cfg, log: log, m: m}, nil
}

// NewInquirer builds a service that only inquires and resolves (the
// console's "inquire" action): it holds no PII keyring, so it never takes
// payments and shows every customer field as masked. Its metrics go to reg
// (nil: none).
func NewInquirer(pool *pgxpool.Pool, prov provider.Provider, cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Service, error) {
	if pool == nil || prov == nil {
		return nil, errors.New("payments: pool and provider are required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg = cfg.withDefaults()
	cfg.HealthGaugesElsewhere = true // the console exports them from its snapshot
	m, err := newMetrics(reg, false)
	if err != nil {
		return nil, fmt.Errorf("payments: metrics: %w", err)
	}
	return &Service{pool: pool, prov: prov, cfg: cfg, log: log, m: m}, nil
}

// nowArg is the clock argument of a statement: nil lets the database
// decide (dbNow), an injected clock's reading otherwise.
func (s *Service) nowArg() *time.Time {
	if s.cfg.Now == nil {
		return nil
	}
	t := s.cfg.Now().UTC().Truncate(time.Microsecond)
	return &t
}

// dbNow is a statement's "now": the @now argument (nowArg) or, when it is
// NULL, the database clock. Every timestamp the service writes and every
// lease, due time and expiry it compares goes through it, so one clock
// decides them all. The database clock is the transaction's start, now():
// the rows one transaction writes (the key, the payment, its reservation
// and the outbox event, whose created_at defaults to now()) carry one time,
// so the trace page lists them in the order of cause and effect rather than
// the event first by the microseconds between BEGIN and the key's insert.
// The service's transactions are short (the provider is called outside
// them), so a lease judged at the transaction's start is off by at most that.
const dbNow = `coalesce(@now::timestamptz, now())`

// poke wakes the relays after a commit that wrote an outbox event.
func (s *Service) poke() {
	if s.cfg.Poker != nil {
		s.cfg.Poker.Poke()
	}
}

// Authenticate returns the merchant of an API key (ErrUnauthenticated for a
// malformed, unknown or revoked one).
func (s *Service) Authenticate(ctx context.Context, apiKey string) (string, error) {
	merchantID, _, err := Authenticate(ctx, s.pool, apiKey)
	return merchantID, err
}

// PaymentOf is what a merchant sees of its payment: its state and the
// customer fields masked. Another merchant's payment is ErrNotFound, like a
// missing one, so a merchant learns nothing about others' payments.
func (s *Service) PaymentOf(ctx context.Context, merchantID string, op uuid.UUID) (PaymentBody, error) {
	p, err := Get(ctx, s.pool, op)
	if err != nil {
		return PaymentBody{}, fmt.Errorf("payments: payment %s: %w", op, err)
	}
	if p.MerchantID != merchantID {
		return PaymentBody{}, ErrNotFound
	}
	b := bodyOf(p)
	b.Customer = s.MaskedCustomer(p)
	return b, nil
}

// MaskedCustomer is MaskCustomer with this service's keys.
func (s *Service) MaskedCustomer(p Payment) map[string]string { return MaskCustomer(s.kr, p) }

// MaskCustomer opens and masks a payment's customer fields (the payment
// table's schema in internal/pii); a value under a key kr does not hold, or
// one that does not open for this payment, shows as "undecryptable". With
// no keys (nil kr: an inquirer, a console without PII_KEYS) every value
// shows as sealed.
func MaskCustomer(kr *pii.Keyring, p Payment) map[string]string {
	clear := make(map[string]string, len(p.Customer))
	for field, env := range p.Customer {
		if kr == nil {
			clear[field] = env // MaskRecord shows an envelope as "[encrypted]"
			continue
		}
		v, err := kr.Open(CustomerPlace(p.OperationID), field, env)
		if err != nil {
			v = pii.Undecryptable
		}
		clear[field] = v
	}
	return pii.MaskRecord(CustomerTable, clear)
}

// Ready reports whether the database answers and carries the schema this
// binary ships.
func (s *Service) Ready(ctx context.Context) error {
	if err := db.Ready(ctx, s.pool); err != nil {
		return fmt.Errorf("payments: ready: %w", err)
	}
	return nil
}

// charge calls the provider and returns the call for settle to record in
// its transaction (callRecord); a caller that does not settle records it
// with recordCall.
func (s *Service) charge(ctx context.Context, req provider.ChargeRequest) (provider.Result, callRecord, error) {
	start := time.Now()
	res, err := s.prov.Charge(ctx, req)
	end := time.Now()
	d := end.Sub(start)
	s.m.providerCall.WithLabelValues("charge").Observe(d.Seconds())
	return res, callRecord{kind: "charge", d: d, end: end, res: res, err: err}, err
}

func (s *Service) inquire(ctx context.Context, p Payment) (provider.Result, error) {
	start := time.Now()
	res, err := s.prov.Inquire(ctx, p.OperationID)
	end := time.Now()
	d := end.Sub(start)
	s.m.providerCall.WithLabelValues("inquire").Observe(d.Seconds())
	s.recordCall(ctx, p.OperationID, callRecord{kind: CallInquire, d: d, end: end, res: res, err: err})
	return res, err
}
