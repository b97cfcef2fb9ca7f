package payments

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/payments/provider"
)

// answerLosingProxy stands between the service and PostgreSQL. Armed with
// a piece of SQL, it lets the next statement carrying it run and commit,
// then drops the connection instead of passing the answer on: a commit the
// client cannot know happened, as when a network cut or a restarted pooler
// comes between the server's COMMIT and its reply.
type answerLosingProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	marker []byte
	lost   int // answers dropped
}

func newAnswerLosingProxy(t *testing.T, target string) *answerLosingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &answerLosingProxy{ln: ln, target: target}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

// loseAnswerTo arms the proxy for the next statement whose text contains sql.
func (p *answerLosingProxy) loseAnswerTo(sql string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker = []byte(sql)
}

func (p *answerLosingProxy) answersLost() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lost
}

func (p *answerLosingProxy) serve(client net.Conn) {
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	closeBoth := func() { _ = client.Close(); _ = server.Close() }
	armed := make(chan struct{})
	var once sync.Once
	go func() { // client → server, verbatim; the marker arms this connection
		buf := make([]byte, 64<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 {
				p.mu.Lock()
				if p.marker != nil && bytes.Contains(buf[:n], p.marker) {
					p.marker = nil
					once.Do(func() { close(armed) })
				}
				p.mu.Unlock()
				if _, err := server.Write(buf[:n]); err != nil {
					closeBoth()
					return
				}
			}
			if err != nil {
				closeBoth()
				return
			}
		}
	}()
	// server → client. Once armed (the client waits for each reply before
	// its next request, so a read then starts at a message), the replies
	// are read as messages (type byte, int32 length) one round at a time,
	// up to ReadyForQuery. pgx first parses and describes a statement (a
	// round without CommandComplete, passed on) and then executes it: the
	// round that carries CommandComplete is the statement's answer, and is
	// dropped with the connection.
	buf := make([]byte, 64<<10)
	var round []byte
	for {
		n, err := server.Read(buf)
		select {
		case <-armed:
		default:
			if n > 0 {
				if _, werr := client.Write(buf[:n]); werr != nil {
					closeBoth()
					return
				}
			}
			if err != nil {
				closeBoth()
				return
			}
			continue
		}
		round = append(round, buf[:n]...)
		for {
			end, completed, ready := roundEnd(round)
			if !ready {
				break
			}
			if completed {
				p.mu.Lock()
				p.lost++
				p.mu.Unlock()
				closeBoth()
				return
			}
			if _, werr := client.Write(round[:end]); werr != nil {
				closeBoth()
				return
			}
			round = round[end:]
		}
		if err != nil {
			closeBoth()
			return
		}
	}
}

// roundEnd finds the first ReadyForQuery in b: ready when b holds one, end
// just after it, completed when a CommandComplete came before it.
func roundEnd(b []byte) (end int, completed, ready bool) {
	for i := 0; i+5 <= len(b); {
		n := int(binary.BigEndian.Uint32(b[i+1 : i+5]))
		if i+1+n > len(b) {
			return 0, false, false
		}
		switch b[i] {
		case 'C':
			completed = true
		case 'Z':
			return i + 1 + n, completed, true
		}
		i += 1 + n
	}
	return 0, false, false
}

// lossyEnv is newEnv with the service's connections going through an
// answerLosingProxy.
func lossyEnv(t *testing.T) (*env, *answerLosingProxy) {
	t.Helper()
	e := newEnv(t, envOpts{providerTimeout: shortTimeout})
	cfg := dbtest.AppRole(t, e.pool).Config().Copy()
	px := newAnswerLosingProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	cfg.ConnConfig.Host = "127.0.0.1"
	cfg.ConnConfig.Port = uint16(px.ln.Addr().(*net.TCPAddr).Port)
	cfg.ConnConfig.Fallbacks = nil
	pool, err := db.OpenConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	svc, err := NewService(pool, provider.NewClient(e.sim.URL(), shortTimeout), e.kr, Config{Now: e.clk.Now, Lease: 30 * time.Second}, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	e.svc = svc
	return e, px
}

// providerCharges is how many charge requests the provider received for
// op, and how many the payment's trace records.
func (e *env) providerCharges(op uuid.UUID) (received, recorded int) {
	e.t.Helper()
	if c, ok := e.sim.Charge(op); ok {
		received = c.Calls
	}
	return received, e.count(`SELECT count(*) FROM payment_provider_call WHERE operation_id = $1 AND op = 'charge'`, op)
}

// A reserve that committed while its answer was lost is this request's
// reservation: the service finds it by its operation id and goes on with
// the charge at once. Before, it answered 500 and left the payment
// processing with its funds held and nobody calling the provider until
// the lease ended; recovery's inquiry, answered "unknown", then made a
// charge that was never sent an unknown payment.
func TestAReserveWhoseAnswerIsLostStillCharges(t *testing.T) {
	e, px := lossyEnv(t)
	e.account(7001, "100.00")
	key, req := newKey(), payBody(randomInvoice(), 7001, "10.00")
	px.loseAnswerTo("INSERT INTO balance_reservation")
	a := e.post(key, req)
	if px.answersLost() != 1 {
		t.Fatalf("the proxy dropped %d answers, want the reserve's", px.answersLost())
	}
	if a.status != 201 || a.replayed {
		t.Fatalf("first answer %d (replayed %v, err %v) %s; want the payment's 201, not a replay", a.status, a.replayed, a.err, a.body)
	}
	op := uuid.MustParse(a.json(t)["operation_id"].(string))
	p, err := Get(context.Background(), e.pool, op)
	if err != nil {
		t.Fatal(err)
	}
	if p.Status != StatusCompleted {
		t.Errorf("payment %s, want completed", p.Status)
	}
	if got, rec := e.providerCharges(op); got != 1 || rec != 1 {
		t.Errorf("provider received %d charges, the trace records %d; want 1 and 1", got, rec)
	}
	b := e.post(key, req)
	if b.status != 201 || !b.replayed || !bytes.Equal(b.body, a.body) {
		t.Errorf("retry with the key: %d replayed %v %s; want the first answer replayed", b.status, b.replayed, b.body)
	}
	e.checkBooks(7001)
}

// A settlement that committed while its answer was lost: the fallbacks
// that then settle and record the provider call again find it recorded,
// so the trace shows the one charge sent, and the answer (read from the
// key's record) is this request's own, not a replay.
func TestASettlementWhoseAnswerIsLostRecordsTheChargeOnce(t *testing.T) {
	e, px := lossyEnv(t)
	e.account(7002, "100.00")
	e.svc.afterReserve = func(Payment) error { px.loseAnswerTo("WITH lease AS"); return nil }
	key, req := newKey(), payBody(randomInvoice(), 7002, "10.00")
	a := e.post(key, req)
	e.svc.afterReserve = nil
	if px.answersLost() != 1 {
		t.Fatalf("the proxy dropped %d answers, want the settlement's", px.answersLost())
	}
	if a.status != 201 || a.replayed {
		t.Fatalf("first answer %d (replayed %v, err %v) %s; want the payment's 201, not a replay", a.status, a.replayed, a.err, a.body)
	}
	op := uuid.MustParse(a.json(t)["operation_id"].(string))
	if got, rec := e.providerCharges(op); got != 1 || rec != 1 {
		t.Errorf("provider received %d charges, the trace records %d; want 1 and 1", got, rec)
	}
	e.checkBooks(7002)
}

// A client that hangs up does not cut the request's reserve: the payment
// is made as if it had waited, and its answer waits for the retry.
func TestAClientThatHangsUpDoesNotCutTheReserve(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.account(7003, "100.00")
	e.keyOf(e.merchant)
	key, req := newKey(), payBody(randomInvoice(), 7003, "10.00")
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // gone before the service started
	resp, err := e.svc.Create(ctx, e.merchant, key, req)
	if err != nil || resp.Status != 201 {
		t.Fatalf("Create with the client gone: %d %s, err %v; want the payment made (201)", resp.Status, resp.Body, err)
	}
	b := e.post(key, req)
	if b.status != 201 || !b.replayed || !bytes.Equal(b.body, resp.Body) {
		t.Errorf("retry with the key: %d replayed %v %s; want the first answer replayed", b.status, b.replayed, b.body)
	}
	e.checkBooks(7003)
}

// Two calls alike to the microsecond (fast failures share durations: a
// refused dial, an outage's inquiries) are two calls, both kept; only a
// record that may be in the table already (a settlement whose answer was
// lost) is checked for first.
func TestCallsAlikeAreAllRecorded(t *testing.T) {
	e := newEnv(t, envOpts{})
	op := uuid.Must(uuid.NewV7())
	c := callRecord{kind: "inquire", d: 37 * time.Microsecond, end: time.Now(), err: errors.New("provider: request not processed: connection refused")}
	e.svc.recordCall(context.Background(), op, c)
	e.svc.recordCall(context.Background(), op, c)
	c.maybeRecorded = true
	e.svc.recordCall(context.Background(), op, c)
	if n := e.count(`SELECT count(*) FROM payment_provider_call WHERE operation_id = $1`, op); n != 2 {
		t.Fatalf("%d call records, want 2: the two alike calls, not the third that may have been recorded", n)
	}
}
