// Package paymentsload is the demo's client population of the payments
// API: clients that pay over HTTP, time out, retry with the same
// Idempotency-Key (the right thing) and now and then re-send with a new key
// (the wrong thing, refused by the business identity). It also sets up the
// merchant they pay as.
package paymentsload

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/payments"
)

// WorkloadConfig describes a demo client population.
type WorkloadConfig struct {
	BaseURL       string          // the payments API
	APIKey        string          // the merchant's API key (SetupMerchant makes one)
	Accounts      []int64         // the merchant's accounts to pay from (SetupMerchant creates them)
	Rate          float64         // payments started per second (default 2)
	ClientTimeout time.Duration   // a client's patience per request (default 3s)
	MaxRetries    int             // retries with the same key (default 6)
	NewKeyRate    float64         // share of finished payments a buggy client re-sends with a new key (default 0.05)
	MaxAmount     decimal.Decimal // amounts are 1..MaxAmount (default 500)
	TopUp         decimal.Decimal // credit added when an account runs dry (default 100000; needs Pool)
	Pool          *pgxpool.Pool   // optional: for top-ups
	Logger        *slog.Logger
}

// WorkloadStats counts what the clients saw.
type WorkloadStats struct {
	Started, Completed, Declined, Unknown, InsufficientFunds, DuplicateInvoice int64
	Replays, InProgress, Retries, Timeouts, Errors                             int64
}

// Workload is a population of clients that pay, time out, retry with the
// same key (the right thing), and now and then re-send with a new key (the
// wrong thing, refused by the business identity).
type Workload struct {
	cfg   WorkloadConfig
	hc    *http.Client
	stats struct {
		started, completed, declined, unknown, insufficient, duplicate atomic.Int64
		replays, inProgress, retries, timeouts, errors                 atomic.Int64
	}
}

// NewWorkload builds a workload.
func NewWorkload(cfg WorkloadConfig) *Workload {
	if cfg.Rate <= 0 {
		cfg.Rate = 2
	}
	if cfg.ClientTimeout <= 0 {
		cfg.ClientTimeout = 3 * time.Second
	}
	if cfg.MaxRetries <= 0 {
		cfg.MaxRetries = 6
	}
	if cfg.NewKeyRate == 0 {
		cfg.NewKeyRate = 0.05
	}
	if !cfg.MaxAmount.IsPositive() {
		cfg.MaxAmount = decimal.New(500, 0)
	}
	if !cfg.TopUp.IsPositive() {
		cfg.TopUp = decimal.New(100000, 0)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Workload{cfg: cfg, hc: &http.Client{Timeout: cfg.ClientTimeout}}
}

// SetupMerchant makes a merchant ready to pay: the merchant (kept if it
// exists), its accounts (SetupAccounts) and a new API key, returned once.
func SetupMerchant(ctx context.Context, pool *pgxpool.Pool, merchantID, name string, accounts []int64, opening decimal.Decimal) (string, error) {
	if err := payments.CreateMerchant(ctx, pool, merchantID, name); err != nil && !errors.Is(err, payments.ErrMerchantExists) {
		return "", fmt.Errorf("paymentsload: set up merchant %s: %w", merchantID, err)
	}
	if err := SetupAccounts(ctx, pool, merchantID, accounts, opening); err != nil {
		return "", err
	}
	key, _, err := payments.CreateKey(ctx, pool, merchantID)
	if err != nil {
		return "", fmt.Errorf("paymentsload: set up merchant %s: %w", merchantID, err)
	}
	return key, nil
}

// SetupAccounts creates the merchant's accounts (TRY) with an opening
// balance; existing accounts keep their balance and are given to the
// merchant when they have no owner yet.
func SetupAccounts(ctx context.Context, pool *pgxpool.Pool, merchantID string, ids []int64, opening decimal.Decimal) error {
	for _, id := range ids {
		err := payments.CreateAccount(ctx, pool, merchantID, id, "TRY", opening)
		if errors.Is(err, payments.ErrAccountExists) {
			err = payments.AssignAccount(ctx, pool, merchantID, id)
		}
		if err != nil {
			return fmt.Errorf("paymentsload: set up account %d: %w", id, err)
		}
	}
	return nil
}

// Stats is a snapshot of the counters.
func (w *Workload) Stats() WorkloadStats {
	s := &w.stats
	return WorkloadStats{Started: s.started.Load(), Completed: s.completed.Load(), Declined: s.declined.Load(), Unknown: s.unknown.Load(),
		InsufficientFunds: s.insufficient.Load(), DuplicateInvoice: s.duplicate.Load(), Replays: s.replays.Load(),
		InProgress: s.inProgress.Load(), Retries: s.retries.Load(), Timeouts: s.timeouts.Load(), Errors: s.errors.Load()}
}

// Run starts payments at the configured rate until ctx ends, then waits for
// the ones in flight.
func (w *Workload) Run(ctx context.Context) error {
	if len(w.cfg.Accounts) == 0 {
		return errors.New("paymentsload: the workload needs accounts")
	}
	t := time.NewTicker(time.Duration(float64(time.Second) / w.cfg.Rate))
	defer t.Stop()
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		select {
		case sem <- struct{}{}:
		default:
			continue // the clients are saturated: skip a tick rather than queue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			w.onePayment(ctx)
		}()
	}
}

func (w *Workload) onePayment(ctx context.Context) {
	w.stats.started.Add(1)
	account := w.cfg.Accounts[rand.IntN(len(w.cfg.Accounts))]
	cents := 100 + rand.Int64N(w.cfg.MaxAmount.Shift(2).IntPart())
	body, _ := json.Marshal(map[string]any{
		"invoice_id": "inv-" + uuid.NewString()[:18],
		"account_id": account,
		"amount":     decimal.New(cents, -2).StringFixed(2),
		"currency":   "TRY",
		"customer": map[string]string{
			"name":   demoNames[rand.IntN(len(demoNames))],
			"email":  fmt.Sprintf("customer%d@example.com", rand.IntN(10000)),
			"tax_id": fmt.Sprintf("%011d", rand.Int64N(99999999999)),
		},
	})
	status, code := w.payWithRetries(ctx, uuid.NewString(), body)
	switch {
	case status == 201:
		w.stats.completed.Add(1)
	case status == 202:
		w.stats.unknown.Add(1)
	case status == 402 && code == payments.CodeInsufficientFunds:
		w.stats.insufficient.Add(1)
		if w.cfg.Pool != nil {
			if err := payments.Credit(ctx, w.cfg.Pool, account, w.cfg.TopUp, "demo top-up"); err != nil && ctx.Err() == nil {
				w.cfg.Logger.Warn("workload: top-up", "account", account, "err", err)
			}
		}
	case status == 402 || status == 502:
		w.stats.declined.Add(1)
	}
	// A buggy client: the same invoice again under a brand-new key.
	if status != 0 && status != 402 && rand.Float64() < w.cfg.NewKeyRate {
		if s, c := w.payWithRetries(ctx, uuid.NewString(), body); s == 422 && c == payments.CodeDuplicateInvoice {
			w.stats.duplicate.Add(1)
		}
	}
}

// payWithRetries sends body under key, retrying with the same key on
// timeouts, 409 in progress and 5xx, as a well-behaved client does.
func (w *Workload) payWithRetries(ctx context.Context, key string, body []byte) (int, string) {
	wait := 200 * time.Millisecond
	for attempt := 0; attempt <= w.cfg.MaxRetries; attempt++ {
		if attempt > 0 {
			w.stats.retries.Add(1)
			select {
			case <-ctx.Done():
				return 0, ""
			case <-time.After(wait):
			}
			wait = min(wait*2, 5*time.Second)
		}
		status, code, retryAfter, replayed, err := w.post(ctx, key, body)
		if err != nil {
			if ctx.Err() != nil {
				return 0, ""
			}
			w.stats.timeouts.Add(1)
			continue
		}
		if replayed {
			w.stats.replays.Add(1)
		}
		switch {
		case status == 409 && code == payments.CodeInProgress:
			w.stats.inProgress.Add(1)
			if retryAfter > 0 {
				wait = time.Duration(retryAfter) * time.Second
			}
			continue
		case status >= 500 && status != 502:
			continue
		}
		return status, code
	}
	w.stats.errors.Add(1)
	return 0, ""
}

func (w *Workload) post(ctx context.Context, key string, body []byte) (status int, code string, retryAfter int, replayed bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.cfg.BaseURL+"/v1/payments", bytes.NewReader(body))
	if err != nil {
		return 0, "", 0, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Authorization", "Bearer "+w.cfg.APIKey)
	resp, err := w.hc.Do(req)
	if err != nil {
		return 0, "", 0, false, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	var b struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(data, &b)
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	return resp.StatusCode, b.Code, ra, resp.Header.Get("Idempotent-Replayed") == "true", nil
}

var demoNames = []string{"Ayşe Yılmaz", "Mehmet Demir", "Elif Kaya", "Can Öztürk", "Zeynep Şahin", "Ali Çelik", "Deniz Arslan"}
