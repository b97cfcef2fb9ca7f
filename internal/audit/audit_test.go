package audit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func record(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < n; i++ {
		err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
			return audit.Record(ctx, tx, audit.Event{
				ActorIss: "https://idp", ActorSub: fmt.Sprint("sub-", i), ActorRoles: []string{"operator"},
				Action: "outbox.retry", TargetType: "outbox_event", TargetID: fmt.Sprint(i),
				Before: json.RawMessage(`{"status":  "dead", "a": 1}`), Outcome: audit.OutcomeOK,
			})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func verify(t *testing.T, pool *pgxpool.Pool) audit.VerifyResult {
	t.Helper()
	res, err := audit.Verify(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func seqs(t *testing.T, pool *pgxpool.Pool) []int64 {
	t.Helper()
	rows, _ := pool.Query(context.Background(), `SELECT seq FROM audit_event ORDER BY seq`)
	s, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestChainIntactAfterAppends(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	record(t, pool, 5)
	res := verify(t, pool)
	if !res.Intact() || res.Checked != 5 || len(res.HeadHash) != 32 {
		t.Fatalf("want intact chain of 5, got %+v", res)
	}
}

func TestRollbackLeavesNoAuditRow(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	boom := errors.New("action failed")
	err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		if err := audit.Record(ctx, tx, audit.Event{Action: "x", Outcome: audit.OutcomeOK}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if n := len(seqs(t, pool)); n != 0 {
		t.Fatalf("rolled back audit row is visible: %d rows", n)
	}
	record(t, pool, 2) // the sequence gap left behind is not a break
	if res := verify(t, pool); !res.Intact() {
		t.Fatalf("gap in seq reported as broken: %+v", res)
	}
}

// asSuperuser edits the table past its triggers, the way an attacker with
// the database owner's password could.
func asSuperuser(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	ctx := context.Background()
	err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sql, args...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestVerifyFindsEditedDeletedAndReorderedRows(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		tamper func(t *testing.T, pool *pgxpool.Pool, s []int64) int64 // returns the seq Verify must name
	}{
		{"edited reason", func(t *testing.T, pool *pgxpool.Pool, s []int64) int64 {
			asSuperuser(t, pool, `UPDATE audit_event SET reason = 'nothing to see' WHERE seq = $1`, s[2])
			return s[2]
		}},
		{"edited jsonb", func(t *testing.T, pool *pgxpool.Pool, s []int64) int64 {
			asSuperuser(t, pool, `UPDATE audit_event SET before = '{"status":"pending"}' WHERE seq = $1`, s[1])
			return s[1]
		}},
		{"deleted row", func(t *testing.T, pool *pgxpool.Pool, s []int64) int64 {
			asSuperuser(t, pool, `DELETE FROM audit_event WHERE seq = $1`, s[2])
			return s[3]
		}},
		{"reordered rows", func(t *testing.T, pool *pgxpool.Pool, s []int64) int64 {
			asSuperuser(t, pool, `UPDATE audit_event SET seq = -1 WHERE seq = $1`, s[1])
			asSuperuser(t, pool, `UPDATE audit_event SET seq = $1 WHERE seq = $2`, s[1], s[3])
			asSuperuser(t, pool, `UPDATE audit_event SET seq = $1 WHERE seq = -1`, s[3])
			return s[1]
		}},
		// The application's role may INSERT, and so choose a seq: a row
		// before every other is walked too.
		{"row inserted with seq -1", func(t *testing.T, pool *pgxpool.Pool, s []int64) int64 {
			if _, err := pool.Exec(context.Background(), `INSERT INTO audit_event (seq, action, actor_name, outcome, prev_hash, hash)
				VALUES (-1, 'pii.reveal', 'alice', 'ok', '\x00', '\x00')`); err != nil {
				t.Fatal(err)
			}
			return -1
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.New(t)
			record(t, pool, 5)
			want := c.tamper(t, pool, seqs(t, pool))
			res := verify(t, pool)
			if res.FirstBroken != want {
				t.Fatalf("Verify named seq %d (%s), want %d", res.FirstBroken, res.Problem, want)
			}
		})
	}
}

func TestChangesAreRefused(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	record(t, pool, 2)
	ctx := context.Background()
	for _, sql := range []string{
		`UPDATE audit_event SET reason = 'x'`,
		`DELETE FROM audit_event`,
		`TRUNCATE audit_event`,
	} {
		_, err := pool.Exec(ctx, sql)
		if db.Code(err) != db.CodeInsufficientPriv {
			t.Errorf("%s: want SQLSTATE %s, got %v", sql, db.CodeInsufficientPriv, err)
		}
	}
	if res := verify(t, pool); !res.Intact() || res.Checked != 2 {
		t.Fatalf("chain changed: %+v", res)
	}
}

// The application's role may INSERT, so it could plant a row far ahead of
// the sequence: the chain's head by seq from then on, every real append
// after it out of order, and verify failing for good (a security review).
// Such a row is refused, also when the role first makes a temporary table
// of the same name whose sequence it may set (a review got past the first
// version of the trigger that way); appends go on, and the chain stays
// intact.
func TestARowAheadOfTheSequenceIsRefused(t *testing.T) {
	t.Parallel()
	app := dbtest.AppRole(t, dbtest.New(t))
	record(t, app, 2)
	ctx := context.Background()
	plant := `INSERT INTO public.audit_event (seq, action, actor_name, outcome, prev_hash, hash)
		VALUES (1000000000000, 'pii.reveal', 'alice', 'ok', '\x00', '\x00')`
	if _, err := app.Exec(ctx, plant); db.Code(err) != db.CodeInsufficientPriv {
		t.Fatalf("a row ahead of the sequence: want SQLSTATE %s, got %v", db.CodeInsufficientPriv, err)
	}
	conn, err := app.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`CREATE TEMP TABLE audit_event (seq bigserial)`,
		`SELECT setval(pg_get_serial_sequence('audit_event', 'seq'), 1000000000000)`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if _, err := conn.Exec(ctx, plant); db.Code(err) != db.CodeInsufficientPriv {
		t.Fatalf("a row ahead of the sequence behind a temporary table: want SQLSTATE %s, got %v", db.CodeInsufficientPriv, err)
	}
	if _, err := conn.Exec(ctx, `DROP TABLE pg_temp.audit_event`); err != nil {
		t.Fatal(err)
	}
	conn.Release()
	record(t, app, 2)
	if res := verify(t, app); !res.Intact() || res.Checked != 4 {
		t.Fatalf("after the refused rows: %+v", res)
	}
}

func TestConcurrentAppendsNeverFork(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- db.WithTx(ctx, pool, func(tx pgx.Tx) error {
				return audit.Record(ctx, tx, audit.Event{Action: "payment.resolve", TargetID: fmt.Sprint(i), Outcome: audit.OutcomeOK})
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var forks int
	if err := pool.QueryRow(ctx, `SELECT count(*) - count(DISTINCT prev_hash) FROM audit_event`).Scan(&forks); err != nil {
		t.Fatal(err)
	}
	if res := verify(t, pool); !res.Intact() || res.Checked != 20 || forks != 0 {
		t.Fatalf("want 20 chained rows and no fork, got %+v forks=%d", res, forks)
	}
}

// Attacker data (a crafted User-Agent, a raw path) may be invalid UTF-8 or
// carry NUL bytes, which PostgreSQL refuses in text: the event is still
// recorded (with replacement characters) and the chain still verifies.
func TestAttackerTextIsStillRecorded(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		return audit.Record(ctx, tx, audit.Event{
			Action: "request.denied", TargetType: "route", TargetID: "POST /x\x00y",
			UserAgent: "evil\xff\xfeagent", ActorRoles: []string{"view\xc3"}, Outcome: audit.OutcomeDenied,
		})
	})
	if err != nil {
		t.Fatalf("an event with attacker text was not recorded: %v", err)
	}
	var ua, target string
	if err := pool.QueryRow(ctx, `SELECT user_agent, target_id FROM audit_event`).Scan(&ua, &target); err != nil {
		t.Fatal(err)
	}
	if ua != "evil\uFFFDagent" || target != "POST /x\uFFFDy" {
		t.Fatalf("stored %q / %q", ua, target)
	}
	if res := verify(t, pool); !res.Intact() || res.Checked != 1 {
		t.Fatalf("chain %+v", res)
	}
}

// Under REPEATABLE READ the transaction's snapshot can predate the last
// append, so the chain head it reads is stale: Record refuses instead of
// forking the chain.
func TestAppendRefusedOutsideReadCommitted(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	record(t, pool, 1)
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT count(*) FROM audit_event`); err != nil { // takes the snapshot
		t.Fatal(err)
	}
	record(t, pool, 1) // commits after that snapshot
	err = audit.Record(ctx, tx, audit.Event{Action: "payment.resolve", Outcome: audit.OutcomeOK})
	if err == nil {
		err = tx.Commit(ctx)
	}
	if !errors.Is(err, audit.ErrInvalidEvent) {
		t.Errorf("Record in a REPEATABLE READ transaction: %v, want ErrInvalidEvent", err)
	}
	if res := verify(t, pool); !res.Intact() || res.Checked != 2 {
		t.Fatalf("chain forked: %+v", res)
	}
}
