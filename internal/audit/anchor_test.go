package audit_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/testkit"
)

func newKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func anchor(t *testing.T, pool *pgxpool.Pool, key ed25519.PrivateKey) audit.Anchor {
	t.Helper()
	a, err := audit.NewAnchor(context.Background(), pool, key, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func checkAnchors(t *testing.T, pool *pgxpool.Pool, anchors []audit.Anchor, pub ed25519.PublicKey) audit.AnchorReport {
	t.Helper()
	rep, err := audit.CheckAnchors(context.Background(), pool, anchors, pub)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// Truncating the tail, or editing a row and recomputing every later hash,
// leaves a chain that Verify finds intact: only the anchors catch it, and
// they name the anchor whose head is missing or different.
func TestAnchorsCatchTruncatedAndRecomputedChains(t *testing.T) {
	t.Parallel()
	key := newKey(t)
	pub := key.Public().(ed25519.PublicKey)
	cases := []struct {
		name   string
		tamper func(t *testing.T, pool *pgxpool.Pool, s []int64)
		want   string
	}{
		{"newest 50 deleted", func(t *testing.T, pool *pgxpool.Pool, s []int64) {
			asSuperuser(t, pool, `DELETE FROM audit_event WHERE seq >= $1`, s[len(s)-50])
		}, "no longer holds seq"},
		{"one row edited, later hashes recomputed", func(t *testing.T, pool *pgxpool.Pool, s []int64) {
			ctx := context.Background()
			err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `UPDATE audit_event SET reason = 'nothing happened' WHERE seq = $1`, s[10]); err != nil {
					return err
				}
				return audit.RecomputeChain(ctx, tx)
			})
			if err != nil {
				t.Fatal(err)
			}
		}, "rewritten"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.New(t)
			empty := anchor(t, pool, key)
			record(t, pool, 60)
			a := anchor(t, pool, key)
			if rep := checkAnchors(t, pool, []audit.Anchor{empty, a}, pub); !rep.OK() || rep.Checked != 2 {
				t.Fatalf("intact chain: %+v", rep)
			}
			c.tamper(t, pool, seqs(t, pool))
			if res := verify(t, pool); !res.Intact() {
				t.Fatalf("the tampering should leave a chain that walks intact: %+v", res)
			}
			rep := checkAnchors(t, pool, []audit.Anchor{empty, a}, pub)
			if len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0], c.want) || !strings.Contains(rep.Problems[0], "seq "+itoa(a.Seq)) {
				t.Fatalf("anchor check: %+v", rep)
			}
		})
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

// A forged anchor (a head the key never signed), an altered one and one
// signed by another key are each reported; genuine ones are not.
func TestForgedAnchorsAreReported(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	key, other := newKey(t), newKey(t)
	record(t, pool, 3)
	good := anchor(t, pool, key)
	altered := good
	altered.At = altered.At.Add(time.Hour)
	foreign := anchor(t, pool, other)
	forged := good
	forged.Sig = base64.StdEncoding.EncodeToString(make([]byte, ed25519.SignatureSize))
	rep := checkAnchors(t, pool, []audit.Anchor{good, altered, foreign, forged}, key.Public().(ed25519.PublicKey))
	if len(rep.Problems) != 3 || !strings.Contains(rep.Problems[0], "does not verify") ||
		!strings.Contains(rep.Problems[1], "signed by key "+foreign.Key) || !strings.Contains(rep.Problems[2], "does not verify") {
		t.Fatalf("report: %+v", rep.Problems)
	}
}

// Anchors round-trip through a JSON-lines file; gaps between periodic
// anchors of more than twice their interval are warnings, not failures.
func TestAnchorFileAndGaps(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	key := newKey(t)
	record(t, pool, 2)
	path := filepath.Join(t.TempDir(), "anchors.jsonl")
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if _, err := audit.AppendAnchor(ctx, pool, key, time.Minute, path); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	anchors, err := audit.ReadAnchors(bytes.NewReader(b))
	if err != nil || len(anchors) != 2 || anchors[1].Line != 2 || anchors[0].EverySeconds != 60 {
		t.Fatalf("read back %+v %v", anchors, err)
	}
	pub := key.Public().(ed25519.PublicKey)
	if rep := checkAnchors(t, pool, anchors, pub); !rep.OK() || len(rep.Warnings) != 0 {
		t.Fatalf("two close anchors: %+v", rep)
	}
	// A checkpoint three intervals later, signed like the real ones.
	late, err := audit.NewAnchor(ctx, lateClock{pool, anchors[1].At.Add(3 * time.Minute)}, key, time.Minute, &anchors[1])
	if err != nil {
		t.Fatal(err)
	}
	rep := checkAnchors(t, pool, append(anchors, late), pub)
	if !rep.OK() || len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "gap") {
		t.Fatalf("gap: %+v", rep)
	}
	if _, err := audit.ReadAnchors(strings.NewReader(string(b) + "\nnot json\n")); err == nil || !strings.Contains(err.Error(), "line 4") {
		t.Fatalf("a bad line: %v", err)
	}
}

// lateClock answers the anchor's head query with a later database clock.
type lateClock struct {
	pool *pgxpool.Pool
	at   time.Time
}

func (l lateClock) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if sql == `SELECT clock_timestamp()` {
		return l.pool.QueryRow(ctx, `SELECT $1::timestamptz`, l.at)
	}
	return l.pool.QueryRow(ctx, sql, args...)
}

func (l lateClock) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return l.pool.Query(ctx, sql, args...)
}

// forgeRow appends a row as the application's role may (INSERT is
// granted): a made-up hash that does not chain.
func forgeRow(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var seq int64
	if err := pool.QueryRow(context.Background(), `INSERT INTO audit_event (action, outcome, prev_hash, hash)
		VALUES ('outbox.retry', 'ok', '\x00', '\x00') RETURNING seq`).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	return seq
}

// An anchor vouches for the rows up to its head, so none is signed over a
// chain that does not verify: a row forged with the application's
// credentials, or the last anchor's own row changed since. An anchor in the
// file is never a starting point (one written before anchors verified, or
// by whoever may write the file, could name a forged head): AppendAnchor
// walks the whole chain, and only a process's own anchors shorten its walk.
func TestAnchorRefusesABrokenChain(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	key := newKey(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "anchors.jsonl")
	record(t, pool, 3)
	first, err := audit.AppendAnchor(ctx, pool, key, time.Minute, path)
	if err != nil || first.Seq == 0 {
		t.Fatalf("first anchor: %+v %v", first, err)
	}
	record(t, pool, 2)
	second, err := audit.AppendAnchor(ctx, pool, key, time.Minute, path)
	if err != nil || second.Seq != first.Seq+2 {
		t.Fatalf("second anchor: %+v %v (first at %d)", second, err, first.Seq)
	}
	forged := forgeRow(t, pool)
	record(t, pool, 1) // chains onto the forged row's hash, so only the forged row breaks
	for name, from := range map[string]*audit.Anchor{"whole chain": nil, "after the last anchor": &second} {
		_, err := audit.NewAnchor(ctx, pool, key, time.Minute, from)
		var broken *audit.BrokenChainError
		if !errors.As(err, &broken) || broken.Seq != forged {
			t.Errorf("%s: %v, want the chain broken at the forged seq %d", name, err, forged)
		}
	}
	// A line naming the forged row as a head, as a writer before this
	// check could have signed it: the file is not trusted.
	forgedHead := audit.Anchor{Seq: forged, Hash: "00", At: time.Now().UTC(), Key: audit.KeyID(key.Public().(ed25519.PublicKey)), Sig: "AAAA"}
	line, _ := json.Marshal(forgedHead)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		t.Fatal(err)
	}
	f.Close()
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := audit.AppendAnchor(ctx, pool, key, time.Minute, path); err == nil {
		t.Fatal("an anchor was appended over a forged row (resumed from the file's last line?)")
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(after, before) {
		t.Fatal("the anchor file changed although no anchor was signed")
	}
	// The last anchor's row edited: refused before any walk.
	asSuperuser(t, pool, `UPDATE audit_event SET reason = 'edited' WHERE seq = $1`, second.Seq)
	asSuperuser(t, pool, `UPDATE audit_event SET hash = '\x01' WHERE seq = $1`, second.Seq)
	_, err = audit.NewAnchor(ctx, pool, key, time.Minute, &second)
	var broken *audit.BrokenChainError
	if !errors.As(err, &broken) || broken.Seq != second.Seq || !strings.Contains(broken.Problem, "last anchor") {
		t.Errorf("the last anchor's row changed: %v", err)
	}
}

// The periodic writer appends its first anchor at once.
func TestAnchorerWritesAtOnce(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	record(t, pool, 1)
	path := filepath.Join(t.TempDir(), "anchors.jsonl")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		(&audit.Anchorer{DB: pool, Key: newKey(t), Every: time.Hour, File: path}).Run(ctx)
	}()
	testkit.Eventually(t, "the first anchor", func() (bool, error) {
		b, err := os.ReadFile(path)
		return err == nil && bytes.Count(b, []byte("\n")) == 1, nil
	})
	cancel()
	<-done
}

func TestSigningKeyForms(t *testing.T) {
	t.Parallel()
	key := newKey(t)
	for name, s := range map[string]string{
		"seed":        base64.StdEncoding.EncodeToString(key.Seed()),
		"private key": base64.StdEncoding.EncodeToString(key),
	} {
		k, err := audit.ParseSigningKey(s)
		if err != nil || !k.Equal(key) {
			t.Errorf("%s: %v", name, err)
		}
	}
	bad := append(append([]byte{}, key.Seed()...), make([]byte, 32)...)
	for name, s := range map[string]string{"not base64": "%%%", "short": "AAAA", "mismatched halves": base64.StdEncoding.EncodeToString(bad)} {
		if _, err := audit.ParseSigningKey(s); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	pub, err := audit.ParseVerifyKey(base64.StdEncoding.EncodeToString(key.Public().(ed25519.PublicKey)))
	if err != nil || !pub.Equal(key.Public()) {
		t.Fatalf("verify key: %v", err)
	}
}
