package main

// P1's SQL floor: what a payment must write, by the seed, run by pgbench
// itself on the same server in the same run, with no HTTP, no Go and no
// index or check beyond the keys the writes need. It answers the question
// P1's ratio cannot answer alone: how close can any payments service come to
// `pgbench -N` on this machine? If the floor is below P1's goal, no service
// reaches the goal here, whatever it trims; and payments/s ÷ floor says how
// much of the database's share the service itself costs.
//
// A payment, as the seed requires it (DESIGN.md's invariant 8): the key's
// record, processing, commits before the provider is called, and the
// outcome after it, so two transactions.
// The first writes the key's record, the payment, the account's reservation
// and payment.requested.v1; the second the payment's outcome, the account's
// debit, one ledger entry, payment.completed.v1 and the key's stored answer.
// Nine row writes and two commits, against `pgbench -N`'s two writes, one
// read and one commit. The product writes more (a reservation row, the
// provider call's record, the per-aggregate sequence, its console's list
// indexes, checks and foreign keys): the floor is what none of that costs.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// floorSchema is the floor's tables, with the product's columns that its
// indexes (floorLadder) need, and only the keys the writes look up by (the
// idempotency key is unique, as the API needs) and the one partial index a
// relay needs to find pending events.
const floorSchema = `
CREATE TABLE account (account_id bigint PRIMARY KEY, balance numeric NOT NULL, reserved numeric NOT NULL DEFAULT 0);
CREATE TABLE idempotency_record (merchant_id text, idempotency_key text, status text NOT NULL, operation_id bigint NOT NULL,
	response jsonb, locked_until timestamptz, created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, expires_at timestamptz NOT NULL,
	PRIMARY KEY (merchant_id, idempotency_key));
CREATE TABLE payment (operation_id bigint PRIMARY KEY, merchant_id text NOT NULL, invoice_id text NOT NULL, payment_type text NOT NULL,
	attempt int NOT NULL, account_id bigint NOT NULL, amount numeric NOT NULL, currency text NOT NULL, status text NOT NULL,
	customer jsonb NOT NULL, customer_email_bidx bytea, customer_tax_id_bidx bytea, unknown_since timestamptz, next_inquiry_at timestamptz,
	created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL);
CREATE TABLE ledger_entry (entry_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, operation_id bigint NOT NULL,
	account_id bigint NOT NULL, amount numeric NOT NULL, created_at timestamptz NOT NULL);
CREATE TABLE outbox_event (id bigint PRIMARY KEY, aggregate_type text NOT NULL, aggregate_id bigint NOT NULL, aggregate_seq int NOT NULL,
	topic text NOT NULL, event_type text NOT NULL, payload jsonb NOT NULL, status text NOT NULL, published_at timestamptz, dead_at timestamptz,
	created_at timestamptz NOT NULL);
CREATE INDEX outbox_event_pending_idx ON outbox_event (id) WHERE status = 'pending';
INSERT INTO account (account_id, balance) SELECT g, 1000000000 FROM generate_series(1, %d) g;
`

// floorScript is one payment as pgbench runs it, in the form that costs the
// database least, the one the service uses too: each transaction one
// statement (its writes as WITH items; its implicit transaction, so no
// BEGIN or COMMIT round trip), prepared once per connection (-M prepared).
// Measured on 6 December: the same writes as five and six statements in
// BEGIN … END ran at 0.4× of this form. -D i=0 starts each client's
// counter, so operation ids grow per client (as UUIDv7 ids grow with time;
// -D run=N keeps each run's apart, the tables growing from run to run as
// the service's do) and every client pays from its own account, as P1's
// clients do. The customer, the event and the stored answer are parameters
// (floorValues), parsed on every call as the service's are, with the sizes
// of the service's: a customer sealed field by field, an event of about
// 700 bytes, an answer of about 500. With extra, it also writes the rows
// the product writes beyond the floor's (floorLadder's fifth step).
func floorScript(extra bool) string {
	reserveExtra, settleExtra := "", ""
	if extra {
		reserveExtra = `,
  r AS (INSERT INTO balance_reservation (operation_id, account_id, amount, status, created_at, updated_at) VALUES (:op::bigint, :acct::bigint, 1, 'active', now(), now()) RETURNING 1),
  s AS (INSERT INTO outbox_aggregate VALUES ('payment', :op::bigint, 1) ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_seq = outbox_aggregate.last_seq + 1 RETURNING 1)`
		settleExtra = `c AS (INSERT INTO payment_provider_call (operation_id, op, started_at, answer) VALUES (:op::bigint, 'charge', now(), 'ok') RETURNING 1),
  r AS (UPDATE balance_reservation SET status = 'finalized', updated_at = now() WHERE operation_id = :op::bigint RETURNING 1),
  s AS (INSERT INTO outbox_aggregate VALUES ('payment', :op::bigint, 1) ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_seq = outbox_aggregate.last_seq + 1 RETURNING 1),
  `
	}
	return `\set i :i + 1
\set op :run * 1000000000000000 + :client_id * 1000000000000 + :i
\set acct :client_id + 1
WITH k AS (INSERT INTO idempotency_record (merchant_id, idempotency_key, status, operation_id, locked_until, created_at, updated_at, expires_at) VALUES ('m-bench', :op::text, 'processing', :op::bigint, now() + interval '30 seconds', now(), now(), now() + interval '1 day') RETURNING 1),
  p AS (INSERT INTO payment (operation_id, merchant_id, invoice_id, payment_type, attempt, account_id, amount, currency, status, customer, customer_email_bidx, customer_tax_id_bidx, created_at, updated_at)
        VALUES (:op::bigint, 'm-bench', :op::text, 'charge', 1, :acct::bigint, 1, 'TRY', 'processing', :customer::jsonb, sha256(:op::text::bytea), sha256((:op::text || 't')::bytea), now(), now()) RETURNING 1),
  a AS (UPDATE account SET reserved = reserved + 1 WHERE account_id = :acct::bigint AND balance - reserved >= 1 RETURNING 1)` + reserveExtra + `
INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, created_at) VALUES (:op::bigint * 2, 'payment', :op::bigint, 1, 'payments', 'payment.requested.v1', :event::jsonb, 'pending', now());
WITH ` + settleExtra + `p AS (UPDATE payment SET status = 'completed', updated_at = now() WHERE operation_id = :op::bigint RETURNING 1),
  a AS (UPDATE account SET balance = balance - 1, reserved = reserved - 1 WHERE account_id = :acct::bigint RETURNING 1),
  l AS (INSERT INTO ledger_entry (operation_id, account_id, amount, created_at) VALUES (:op::bigint, :acct::bigint, -1, now()) RETURNING 1),
  e AS (INSERT INTO outbox_event (id, aggregate_type, aggregate_id, aggregate_seq, topic, event_type, payload, status, created_at) VALUES (:op::bigint * 2 + 1, 'payment', :op::bigint, 2, 'payments', 'payment.completed.v1', :event::jsonb, 'pending', now()) RETURNING 1)
UPDATE idempotency_record SET status = 'completed', response = :answer::jsonb, locked_until = NULL, updated_at = now() WHERE merchant_id = 'm-bench' AND idempotency_key = :op::text;
`
}

// floorStep is one step of floorLadder: SQL run on the floor's database
// (each step keeps the ones before) and whether the script writes the
// product's extra rows from then on.
type floorStep struct {
	Name  string
	SQL   string
	Extra bool
}

// floorLadder climbs from the floor to the product's schema one part at a
// time, each part as the product's migrations write it (the names are
// theirs): where between the floor and the service a payment's database
// cost comes from. bench/run -payments-ladder runs it once, before P1's runs.
var floorLadder = []floorStep{
	{Name: "the floor"},
	{Name: "+ payment's 9 other indexes", SQL: `
CREATE INDEX payment_unknown_idx ON payment (unknown_since, operation_id) WHERE status = 'unknown';
CREATE INDEX payment_processing_idx ON payment (created_at) WHERE status = 'processing';
CREATE INDEX payment_status_created_idx ON payment (status, created_at DESC, operation_id);
CREATE INDEX payment_customer_email_bidx_idx ON payment (customer_email_bidx, operation_id) WHERE customer_email_bidx IS NOT NULL;
CREATE INDEX payment_customer_tax_id_bidx_idx ON payment (customer_tax_id_bidx, operation_id) WHERE customer_tax_id_bidx IS NOT NULL;
CREATE INDEX payment_merchant_status_created_idx ON payment (merchant_id, status, created_at DESC, operation_id);
CREATE INDEX payment_invoice_idx ON payment (invoice_id);
CREATE INDEX payment_failed_check_idx ON payment (next_inquiry_at) WHERE status = 'failed' AND next_inquiry_at IS NOT NULL;
ALTER TABLE payment ADD CONSTRAINT payment_business_attempt UNIQUE (merchant_id, invoice_id, payment_type, attempt);
CREATE UNIQUE INDEX payment_business_identity ON payment (merchant_id, invoice_id, payment_type) WHERE status <> 'failed';`},
	{Name: "+ outbox_event's 9 other indexes", SQL: `
ALTER TABLE outbox_event ADD UNIQUE (aggregate_type, aggregate_id, aggregate_seq);
CREATE INDEX outbox_event_pending_aggregate_idx ON outbox_event (aggregate_type, aggregate_id, id) WHERE status = 'pending';
CREATE INDEX outbox_event_dead_idx ON outbox_event (dead_at DESC, id) WHERE status = 'dead';
CREATE INDEX outbox_event_published_idx ON outbox_event (published_at) WHERE status = 'published';
CREATE INDEX outbox_event_dead_id_idx ON outbox_event (id) WHERE status = 'dead';
CREATE INDEX outbox_event_discarded_idx ON outbox_event (id) WHERE status = 'discarded';
CREATE INDEX outbox_event_topic_idx ON outbox_event (topic, id);
CREATE INDEX outbox_event_type_idx ON outbox_event (event_type, id);
CREATE INDEX outbox_event_pending_topic_idx ON outbox_event (topic, id) WHERE status = 'pending' AND topic > '';
CREATE INDEX outbox_event_dead_aggregate_idx ON outbox_event (aggregate_type, aggregate_id, id) WHERE status = 'dead';`},
	{Name: "+ idempotency_record's 3 and ledger_entry's 2 other indexes", SQL: `
CREATE UNIQUE INDEX idempotency_record_operation_idx ON idempotency_record (operation_id);
CREATE INDEX idempotency_record_processing_idx ON idempotency_record (locked_until) WHERE status = 'processing';
CREATE INDEX idempotency_record_expires_idx ON idempotency_record (expires_at);
CREATE INDEX ledger_entry_operation_idx ON ledger_entry (operation_id);
CREATE INDEX ledger_entry_account_idx ON ledger_entry (account_id, entry_id);`},
	{Name: "+ the product's other rows (reservation, provider call, sequence)", Extra: true, SQL: `
CREATE TABLE balance_reservation (reservation_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, operation_id bigint NOT NULL UNIQUE,
	account_id bigint NOT NULL, amount numeric NOT NULL, status text NOT NULL, created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL);
CREATE INDEX balance_reservation_active_idx ON balance_reservation (account_id) WHERE status = 'active';
CREATE TABLE payment_provider_call (call_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, operation_id bigint NOT NULL, op text NOT NULL,
	started_at timestamptz NOT NULL, answer text);
CREATE INDEX payment_provider_call_op_idx ON payment_provider_call (operation_id, call_id);
CREATE TABLE outbox_aggregate (aggregate_type text, aggregate_id bigint, last_seq bigint NOT NULL, PRIMARY KEY (aggregate_type, aggregate_id));`},
	{Name: "+ foreign keys (4) and checks (8)", SQL: `
ALTER TABLE payment ADD FOREIGN KEY (account_id) REFERENCES account, ADD CHECK (amount > 0), ADD CHECK (attempt >= 1),
	ADD CHECK (status IN ('processing', 'completed', 'failed', 'unknown')), ADD CHECK (currency ~ '^[A-Z]{3}$');
ALTER TABLE ledger_entry ADD FOREIGN KEY (account_id) REFERENCES account;
ALTER TABLE balance_reservation ADD FOREIGN KEY (account_id) REFERENCES account, ADD FOREIGN KEY (operation_id) REFERENCES payment,
	ADD CHECK (status IN ('active', 'finalized', 'released'));
ALTER TABLE account ADD CHECK (reserved >= 0), ADD CHECK (balance >= reserved);
ALTER TABLE outbox_event ADD CHECK (status IN ('pending', 'published', 'dead', 'discarded'));`},
	{Name: "+ the backlog count's insert trigger (migration 00021)", SQL: `
CREATE TABLE outbox_backlog_count (topic text NOT NULL, status text NOT NULL CHECK (status IN ('pending', 'dead')), n bigint NOT NULL);
CREATE FUNCTION outbox_backlog_count_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO outbox_backlog_count (topic, status, n)
    SELECT topic, status, count(*) FROM outbox_new
     WHERE status IN ('pending', 'dead')
     GROUP BY topic, status;
    RETURN NULL;
END
$$;
CREATE TRIGGER outbox_backlog_count_insert AFTER INSERT ON outbox_event
    REFERENCING NEW TABLE AS outbox_new
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_backlog_count_insert();`},
}

// floorValues are the script's text parameters, as pgbench -D arguments.
var floorValues = []string{
	"customer=" + `{"name":"` + strings.Repeat("x", 120) + `","email":"` + strings.Repeat("y", 120) + `","tax_id":"` + strings.Repeat("z", 120) + `"}`,
	"event=" + `{"operation_id":"` + strings.Repeat("e", 36) + `","merchant_id":"m-bench","amount":"1.00","currency":"TRY","customer":{"name":"` +
		strings.Repeat("x", 160) + `","email":"` + strings.Repeat("y", 160) + `","tax_id":"` + strings.Repeat("z", 160) + `"}}`,
	"answer=" + `{"status":"completed","operation_id":"` + strings.Repeat("a", 36) + `","body":"` + strings.Repeat("b", 400) + `"}`,
}

// floorWrites and floorCommits are what one run of floorScript does.
const floorWrites, floorCommits = 9, 2

// setupFloor creates the floor's tables in url's database, with an account
// for each of clients.
func setupFloor(ctx context.Context, url string, clients int) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, fmt.Sprintf(floorSchema, clients)); err != nil {
		return fmt.Errorf("P1 floor schema: %w", err)
	}
	return nil
}

// pgbenchFloor runs floorScript with clients for secs, as the run-th run
// (from 1), and returns payments per second (pgbench's tps: one run of the
// script is one payment).
func pgbenchFloor(ctx context.Context, url string, clients, secs, run int, extra bool) (float64, error) {
	f, err := os.CreateTemp("", "p1-floor-*.sql")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(floorScript(extra)); err != nil {
		f.Close()
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	args := []string{"-n", "-c", strconv.Itoa(clients), "-j", "2", "-T", strconv.Itoa(secs), "-M", "prepared", "-D", "i=0", "-D", "run=" + strconv.Itoa(run)}
	for _, v := range floorValues {
		args = append(args, "-D", v)
	}
	out, err := exec.CommandContext(ctx, "pgbench", append(args, "-f", f.Name(), url)...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("pgbench (P1 floor): %w: %s", err, out)
	}
	// A failed statement ends a pgbench client: a run that lost one is not
	// a floor.
	if m := regexp.MustCompile(`number of failed transactions: ([0-9]+)`).FindSubmatch(out); m != nil && string(m[1]) != "0" {
		return 0, fmt.Errorf("pgbench (P1 floor): %s failed transactions: %s", m[1], out)
	}
	m := regexp.MustCompile(`tps = ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("pgbench (P1 floor): no tps in %s", out)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

// ladderRow is one step of floorLadder as measured.
type ladderRow struct {
	Step              string  `json:"step"`
	PaymentsPerSec    float64 `json:"payments_per_sec"`
	PgbenchTPS        float64 `json:"pgbench_N_tps"` // measured right after the step, to pair it
	Ratio             float64 `json:"ratio"`
	ServerCPUMsPerPay float64 `json:"server_cpu_ms_per_payment"`
}

// runFloorLadder runs floorLadder on a database of its own: each step's SQL,
// then the floor's script for secs, then pgbench -N on pgbURL for secs, each
// phase quiesced as P1's are.
func runFloorLadder(ctx context.Context, admin querier, url, pgbURL string, clients, secs int) ([]ladderRow, error) {
	if err := setupFloor(ctx, url, clients); err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	var rows []ladderRow
	extra := false
	for i, st := range floorLadder {
		if st.SQL != "" {
			if _, err := conn.Exec(ctx, st.SQL); err != nil {
				return nil, fmt.Errorf("P1 ladder step %q: %w", st.Name, err)
			}
		}
		extra = extra || st.Extra
		if err := quiesce(ctx, admin); err != nil {
			return nil, err
		}
		srv0 := serverCPU()
		pay, err := pgbenchFloor(ctx, url, clients, secs, i+1, extra)
		if err != nil {
			return nil, fmt.Errorf("P1 ladder step %q: %w", st.Name, err)
		}
		cpu := float64((serverCPU() - srv0).Microseconds()) / 1000 / (pay * float64(secs))
		if err := quiesce(ctx, admin); err != nil {
			return nil, err
		}
		tps, err := pgbenchN(ctx, pgbURL, clients, secs)
		if err != nil {
			return nil, err
		}
		r := ladderRow{Step: st.Name, PaymentsPerSec: pay, PgbenchTPS: tps, Ratio: pay / tps, ServerCPUMsPerPay: cpu}
		rows = append(rows, r)
		fmt.Printf("  P1 ladder %d  %-66s %6.0f payments/s ÷ pgbench -N %6.0f TPS = %.3f× | server cpu %.2f ms/payment\n", i, r.Step, r.PaymentsPerSec, r.PgbenchTPS, r.Ratio, r.ServerCPUMsPerPay)
	}
	return rows, nil
}
