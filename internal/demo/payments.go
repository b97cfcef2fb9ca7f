package demo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/payments"
	"github.com/sluice-dev/sluice/internal/payments/paymentsapi"
	"github.com/sluice-dev/sluice/internal/payments/paymentsload"
	"github.com/sluice-dev/sluice/internal/payments/provider"
	"github.com/sluice-dev/sluice/internal/pii"
)

// The demo's provider fails the way real ones do: it declines, is slow, is
// briefly down, and sometimes charges and then never answers (→ unknown).
// Most unknown payments are settled by the reconcile worker's inquiries over
// the following minutes; some stay unknown until an operator resolves them.
var demoFaults = provider.SimConfig{
	DeclineRate:            0.08,
	SlowRate:               0.10,
	TimeoutAfterChargeRate: 0.06,
	DownRate:               0.02,
	InquiryUnknownRate:     0.50,
	InquiryStuckRate:       0.25,
	SlowDelay:              800 * time.Millisecond,
	HangFor:                5 * time.Second,
}

const (
	demoProviderTimeout = 2 * time.Second // the payments service gives up here: the outcome is unknown
	demoAccounts        = 20
	demoMerchant        = "demo-merchant"
)

type paymentsPart struct {
	kr       *pii.Keyring // the demo's generated keys; the console reveals with them too
	pool     db.RowQuerier
	sim      *provider.Simulator
	svc      *payments.Service
	srv      *http.Server
	url      string
	workload *paymentsload.Workload
	apiKey   string // the demo merchant's key, shown in the banner's example
}

// startPayments starts the simulated provider, the payments service with its
// recovery and reconcile workers, and a client workload that retries on
// timeouts with the same key.
func (d *Demo) startPayments(ctx context.Context) error {
	keys, blind, err := pii.GenerateSpec("demo1")
	if err != nil {
		return err
	}
	kr, err := pii.ParseKeyring(keys, blind)
	if err != nil {
		return err
	}
	pool, err := d.openPool(ctx, "payments", config.DefaultPaymentsPoolSize)
	if err != nil {
		return err
	}
	p := &paymentsPart{pool: d.pool, kr: kr}
	d.payments = p
	faults := demoFaults
	faults.Logger = d.log
	p.sim = provider.NewSimulator(faults)
	if err := p.sim.Start(d.cfg.ProviderAddr); err != nil {
		return fmt.Errorf("PROVIDER_SIM_ADDR %s: %w", d.cfg.ProviderAddr, err)
	}
	p.svc, err = payments.NewService(pool, provider.NewClient(p.sim.URL(), demoProviderTimeout), kr, payments.Config{
		Lease:             10 * time.Second,
		RecoveryInterval:  2 * time.Second,
		ReconcileInterval: 3 * time.Second,
		InquiryBackoff:    5 * time.Second,
		InquiryBackoffMax: time.Minute,
		Poker:             d.notifier, // relays publish payment.* events at once
		// The console in this process exports these from its snapshot.
		HealthGaugesElsewhere: true,
	}, d.log, d.reg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", d.cfg.PaymentsAddr)
	if err != nil {
		return fmt.Errorf("PAYMENTS_API_ADDR %s: %w", d.cfg.PaymentsAddr, err)
	}
	p.url = "http://" + ln.Addr().String()
	api, err := paymentsapi.New(p.svc, paymentsapi.Config{AllowedHosts: paymentsapi.AllowedHosts(ln.Addr().String(), nil), Logger: d.log, Registerer: d.reg,
		Tracing: d.tracing.Provider()})
	if err != nil {
		ln.Close()
		return err
	}
	p.srv = paymentsapi.NewServer(api)
	d.goRun("payments API", func() error {
		if err := p.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	d.goRun("payments workers", func() error { return p.svc.RunWorkers(ctx) })

	accounts := make([]int64, demoAccounts)
	for i := range accounts {
		accounts[i] = int64(1001 + i)
	}
	// The demo's clients are one merchant that owns the accounts it pays
	// from and authenticates with its own API key.
	if p.apiKey, err = paymentsload.SetupMerchant(ctx, d.pool, demoMerchant, "Demo merchant", accounts, decimal.New(50000, 0)); err != nil {
		return err
	}
	p.workload = paymentsload.NewWorkload(paymentsload.WorkloadConfig{
		BaseURL:  p.url,
		APIKey:   p.apiKey,
		Accounts: accounts,
		Rate:     float64(d.cfg.PaymentRate),
		// Shorter than the service's provider timeout: clients give up on slow or
		// hanging charges and retry with the same key, the scenario of seed 002.
		ClientTimeout: 1500 * time.Millisecond,
		Pool:          pool,
		Logger:        d.log,
	})
	if d.cfg.PaymentRate > 0 {
		d.goRun("payments workload", func() error { return p.workload.Run(ctx) })
	}
	return nil
}

// status is the payments part of a status line.
func (p *paymentsPart) status(ctx context.Context) (string, error) {
	h, err := payments.ReadHealth(ctx, p.pool, 0)
	if err != nil {
		return "", err
	}
	w := p.workload.Stats()
	age := "-"
	if h.Unknown > 0 {
		age = h.ReconcileAge.Round(time.Second).String()
	}
	// The workload's clients' answers, named as such: the payments list
	// counts payment records, which include payments whose client gave up
	// before the answer and payments resolved later (unknown → completed),
	// so "completed" here and there were two numbers under one name.
	// Same-key retries are answered from the stored result (replays);
	// new-key retries for a paid invoice are refused by the business identity.
	return fmt.Sprintf("payments: clients were answered completed %d, declined %d; unknown now %d (oldest %s); client timeouts %d → same-key retries %d (replayed %d), new-key duplicates refused %d",
		w.Completed, w.Declined, h.Unknown, age, w.Timeouts, w.Retries, w.Replays, w.DuplicateInvoice), nil
}

func (p *paymentsPart) close() error {
	var errs []error
	if p.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs = append(errs, p.srv.Shutdown(ctx))
		cancel()
	}
	if p.sim != nil {
		errs = append(errs, p.sim.Close())
	}
	return errors.Join(errs...)
}
