package provider

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"
)

// Behaviour is what the simulator does with one new charge.
type Behaviour string

const (
	BehaveSucceed            Behaviour = "succeed"              // charge and answer at once
	BehaveDecline            Behaviour = "decline"              // refuse; nothing moves
	BehaveTimeoutAfterCharge Behaviour = "timeout_after_charge" // charge, then hold the answer until the client gives up
	BehaveSlow               Behaviour = "slow"                 // wait SlowDelay, then charge and answer
	BehaveDown               Behaviour = "down"                 // 503, nothing processed
)

// InquiryMode is how the simulator answers inquiries.
type InquiryMode string

const (
	InquiryAnswer  InquiryMode = "answer"  // the truth from the charge record
	InquiryUnknown InquiryMode = "unknown" // 200 {"status":"unknown"}
	InquiryDown    InquiryMode = "down"    // 503
)

// SimConfig is the simulator's random fault mix (rates are probabilities in
// [0,1]; what is left over succeeds).
type SimConfig struct {
	DeclineRate            float64
	SlowRate               float64
	TimeoutAfterChargeRate float64
	DownRate               float64
	InquiryUnknownRate     float64 // one inquiry answers "unknown"
	InquiryStuckRate       float64 // an operation whose inquiries always answer "unknown" (needs an operator)
	SlowDelay              time.Duration
	HangFor                time.Duration // longest a timeout_after_charge holds the connection
	Seed                   uint64        // 0: random
	Logger                 *slog.Logger
}

// Charge is one entry of the simulator's own record of charges.
type Charge struct {
	OperationID uuid.UUID `json:"operation_id"`
	Amount      string    `json:"amount"`
	Currency    string    `json:"currency"`
	Status      Outcome   `json:"status"`
	ProviderRef string    `json:"provider_ref"`
	DeclineCode string    `json:"decline_code,omitempty"`
	Calls       int       `json:"calls"` // charge requests received for this operation id
	CreatedAt   time.Time `json:"created_at"`
}

// Simulator is a payment provider with its own HTTP server and record of
// charges. It is idempotent by operation id.
type Simulator struct {
	cfg SimConfig
	log *slog.Logger

	mu        sync.Mutex
	rng       *rand.Rand
	charges   map[uuid.UUID]*Charge
	next      []Behaviour
	inquiry   InquiryMode
	inquiryOp map[uuid.UUID]InquiryMode
	stuck     map[uuid.UUID]bool
	moves     int          // how many times money moved (succeeded charges created)
	charging  atomic.Int64 // charge requests being handled (ChargesInProgress)

	srv  *http.Server
	ln   net.Listener
	done chan struct{}
	once sync.Once
}

// Defaults of SimConfig, applied to zero fields (and shown by
// `console provider-sim --help`).
const (
	DefaultSlowDelay = 1500 * time.Millisecond
	DefaultHangFor   = 30 * time.Second
)

// NewSimulator builds a simulator; Start serves it.
func NewSimulator(cfg SimConfig) *Simulator {
	if cfg.SlowDelay <= 0 {
		cfg.SlowDelay = DefaultSlowDelay
	}
	if cfg.HangFor <= 0 {
		cfg.HangFor = DefaultHangFor
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	lg := cfg.Logger
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	return &Simulator{
		cfg: cfg, log: lg,
		rng:       rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		charges:   map[uuid.UUID]*Charge{},
		inquiry:   InquiryAnswer,
		inquiryOp: map[uuid.UUID]InquiryMode{},
		stuck:     map[uuid.UUID]bool{},
		done:      make(chan struct{}),
	}
}

// Handler is the simulator's HTTP API, including its admin endpoints
// (GET /charges, POST /admin/next, POST /admin/inquiry).
func (s *Simulator) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", s.handleCharge)
	mux.HandleFunc("GET /v1/charges/{id}", s.handleInquiry)
	mux.HandleFunc("GET /charges", s.handleList)
	mux.HandleFunc("POST /admin/next", s.handleNext)
	mux.HandleFunc("POST /admin/inquiry", s.handleInquiryMode)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	return mux
}

// Start listens on addr (e.g. 127.0.0.1:0) and serves in the background.
func (s *Simulator) Start(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("provider-sim: listen %s: %w", addr, err)
	}
	s.ln = ln
	s.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("provider-sim: serve", "err", err)
		}
	}()
	return nil
}

// URL is the base URL of a started simulator.
func (s *Simulator) URL() string {
	if s.ln == nil {
		return ""
	}
	return "http://" + s.ln.Addr().String()
}

// Close stops the server and releases held connections.
func (s *Simulator) Close() error {
	s.once.Do(func() { close(s.done) })
	if s.srv == nil {
		return nil
	}
	return s.srv.Close()
}

// Next queues behaviours for the next new charges, ahead of the random mix.
func (s *Simulator) Next(b ...Behaviour) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next = append(s.next, b...)
}

// SetInquiry sets how inquiries are answered (for every operation).
func (s *Simulator) SetInquiry(m InquiryMode) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inquiry = m
}

// SetInquiryFor overrides the inquiry answer for one operation.
func (s *Simulator) SetInquiryFor(op uuid.UUID, m InquiryMode) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inquiryOp[op] = m
}

// Charges is a copy of the charge record, oldest first.
func (s *Simulator) Charges() []Charge {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Charge, 0, len(s.charges))
	for _, c := range s.charges {
		out = append(out, *c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out
}

// MoneyMoved is how many charges actually moved money.
func (s *Simulator) MoneyMoved() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.moves
}

// ChargesInProgress counts the charge requests the simulator is still
// handling. A slow charge is recorded only after its delay, even when its
// client gave up long before (as a real provider finishes a request nobody
// waits for): while one is in progress, an inquiry may answer not_found for
// an operation whose money is about to move.
func (s *Simulator) ChargesInProgress() int64 { return s.charging.Load() }

// Charge returns the record of one operation.
func (s *Simulator) Charge(op uuid.UUID) (Charge, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.charges[op]
	if !ok {
		return Charge{}, false
	}
	return *c, true
}

func (s *Simulator) pick() Behaviour {
	if len(s.next) > 0 {
		b := s.next[0]
		s.next = s.next[1:]
		return b
	}
	r := s.rng.Float64()
	for _, c := range []struct {
		rate float64
		b    Behaviour
	}{{s.cfg.DownRate, BehaveDown}, {s.cfg.TimeoutAfterChargeRate, BehaveTimeoutAfterCharge}, {s.cfg.DeclineRate, BehaveDecline}, {s.cfg.SlowRate, BehaveSlow}} {
		if r < c.rate {
			return c.b
		}
		r -= c.rate
	}
	return BehaveSucceed
}

// record creates the charge for op once; a repeat returns the first result.
// It reports whether this call created it.
func (s *Simulator) record(op uuid.UUID, amount, currency string, decline bool) (Charge, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.charges[op]; ok {
		return *c, false
	}
	c := &Charge{OperationID: op, Amount: amount, Currency: currency, Status: Succeeded, ProviderRef: "sim_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:16], CreatedAt: time.Now()}
	if decline {
		c.Status, c.ProviderRef, c.DeclineCode = Declined, "", "card_declined"
	} else {
		s.moves++
	}
	c.Calls = 1
	s.charges[op] = c
	return *c, true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Simulator) handleCharge(w http.ResponseWriter, r *http.Request) {
	s.charging.Add(1)
	defer s.charging.Add(-1)
	var in wireCharge
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<14)).Decode(&in); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "bad_request"})
		return
	}
	op, err := uuid.Parse(in.OperationID)
	amount, aerr := decimal.NewFromString(in.Amount)
	if err != nil || aerr != nil || !amount.IsPositive() || r.Header.Get("Idempotency-Key") != in.OperationID {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "bad_request"})
		return
	}
	s.mu.Lock()
	existing, seen := s.charges[op]
	if seen {
		existing.Calls++
	}
	var b Behaviour
	if !seen {
		b = s.pick()
	} else if s.cfg.DownRate > 0 && s.rng.Float64() < s.cfg.DownRate {
		b = BehaveDown
	}
	var replay Charge
	if seen {
		replay = *existing
	}
	s.mu.Unlock()

	if b == BehaveDown {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "unavailable"})
		return
	}
	if seen {
		// Idempotent: the first result again, no money moves.
		writeJSON(w, http.StatusOK, toWire(replay))
		return
	}
	switch b {
	case BehaveSlow:
		select {
		case <-time.After(s.cfg.SlowDelay):
		case <-s.done:
			return
		}
	}
	c, _ := s.record(op, amount.StringFixed(2), in.Currency, b == BehaveDecline)
	if b == BehaveTimeoutAfterCharge {
		// The money moved; the answer never arrives. Hold the connection
		// until the client gives up, then drop it without a word.
		select {
		case <-r.Context().Done():
		case <-time.After(s.cfg.HangFor):
		case <-s.done:
		}
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
		return
	}
	writeJSON(w, http.StatusOK, toWire(c))
}

func toWire(c Charge) wireCharge {
	return wireCharge{OperationID: c.OperationID.String(), Amount: c.Amount, Currency: c.Currency, Status: string(c.Status), ProviderRef: c.ProviderRef, DeclineCode: c.DeclineCode}
}

func (s *Simulator) handleInquiry(w http.ResponseWriter, r *http.Request) {
	op, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "bad_request"})
		return
	}
	s.mu.Lock()
	mode := s.inquiry
	if m, ok := s.inquiryOp[op]; ok {
		mode = m
	}
	if mode == InquiryAnswer {
		if _, decided := s.stuck[op]; !decided {
			s.stuck[op] = s.cfg.InquiryStuckRate > 0 && s.rng.Float64() < s.cfg.InquiryStuckRate
		}
		switch {
		case s.stuck[op]:
			mode = InquiryUnknown
		case s.cfg.DownRate > 0 && s.rng.Float64() < s.cfg.DownRate:
			mode = InquiryDown
		case s.cfg.InquiryUnknownRate > 0 && s.rng.Float64() < s.cfg.InquiryUnknownRate:
			mode = InquiryUnknown
		}
	}
	c, found := s.charges[op]
	var snapshot Charge
	if found {
		snapshot = *c
	}
	s.mu.Unlock()
	switch {
	case mode == InquiryDown:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "unavailable"})
	case mode == InquiryUnknown:
		writeJSON(w, http.StatusOK, wireCharge{OperationID: op.String(), Status: string(Unknown)})
	case !found:
		writeJSON(w, http.StatusOK, wireCharge{OperationID: op.String(), Status: string(NotFound)})
	default:
		writeJSON(w, http.StatusOK, toWire(snapshot))
	}
}

func (s *Simulator) handleList(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"money_moved": s.MoneyMoved(), "charges": s.Charges()})
}

func (s *Simulator) handleNext(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Behaviours []Behaviour `json:"behaviours"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<14)).Decode(&in); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "bad_request"})
		return
	}
	for _, b := range in.Behaviours {
		switch b {
		case BehaveSucceed, BehaveDecline, BehaveTimeoutAfterCharge, BehaveSlow, BehaveDown:
		default:
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "unknown behaviour " + string(b)})
			return
		}
	}
	s.Next(in.Behaviours...)
	writeJSON(w, http.StatusOK, map[string]int{"queued": len(in.Behaviours)})
}

func (s *Simulator) handleInquiryMode(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Mode        InquiryMode `json:"mode"`
		OperationID string      `json:"operation_id"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<14)).Decode(&in); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "bad_request"})
		return
	}
	switch in.Mode {
	case InquiryAnswer, InquiryUnknown, InquiryDown:
	default:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "unknown mode"})
		return
	}
	if in.OperationID == "" {
		s.SetInquiry(in.Mode)
	} else {
		op, err := uuid.Parse(in.OperationID)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "bad operation_id"})
			return
		}
		s.SetInquiryFor(op, in.Mode)
	}
	writeJSON(w, http.StatusOK, map[string]string{"mode": string(in.Mode)})
}
