package audit

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The hash chain proves that no row was edited, deleted or reordered
// relative to its neighbours, but whoever can write the table can delete
// the newest rows, or edit a row and recompute every later hash, and the
// chain still verifies. An anchor is a signed checkpoint of the chain head
// (sequence, hash, time) kept outside the database, signed with an Ed25519
// key the database never sees: as long as the chain still holds every
// anchored head with the same hash, nothing up to the newest anchor was
// truncated or rewritten.

// Anchor is one signed checkpoint; anchors are shipped as JSON lines.
type Anchor struct {
	Seq  int64     `json:"seq"`  // the head's sequence number (0: the chain was empty)
	Hash string    `json:"hash"` // hex sha256 hash of the row at Seq
	At   time.Time `json:"at"`   // database clock when the head was read
	// EverySeconds is the interval the anchor's writer declared for periodic
	// anchors (0: taken on demand); a longer gap between two periodic
	// anchors is reported.
	EverySeconds int64  `json:"every_seconds,omitempty"`
	Key          string `json:"key"` // key id: hex of the first 8 bytes of sha256(public key)
	Sig          string `json:"sig"` // base64 Ed25519 signature of the fields above
	Line         int    `json:"-"`   // line in the file it was read from
}

// signed is what the signature covers: every field but the key id, in a
// fixed text form.
func (a Anchor) signed() []byte {
	return fmt.Appendf(nil, "sluice.audit.anchor.v1\n%d\n%s\n%s\n%d\n", a.Seq, a.Hash, a.At.UTC().Format(time.RFC3339Nano), a.EverySeconds)
}

func (a Anchor) String() string {
	name := fmt.Sprintf("anchor of seq %d at %s", a.Seq, a.At.UTC().Format(time.RFC3339))
	if a.Line > 0 {
		name = fmt.Sprintf("anchor on line %d (seq %d at %s)", a.Line, a.Seq, a.At.UTC().Format(time.RFC3339))
	}
	return name
}

// KeyID names a public key in anchors.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// ParseSigningKey reads AUDIT_SIGNING_KEY: standard base64 of a 32-byte
// Ed25519 seed or of the 64-byte private key (seed followed by public key,
// Go's and libsodium's form).
func ParseSigningKey(s string) (ed25519.PrivateKey, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, errors.New("not standard base64")
	}
	switch len(b) {
	case ed25519.SeedSize:
		return ed25519.NewKeyFromSeed(b), nil
	case ed25519.PrivateKeySize:
		k := ed25519.NewKeyFromSeed(b[:ed25519.SeedSize])
		if !bytes.Equal(k[ed25519.SeedSize:], b[ed25519.SeedSize:]) {
			return nil, errors.New("the 64-byte key's public half does not match its seed")
		}
		return k, nil
	}
	return nil, fmt.Errorf("%d bytes: want a 32-byte Ed25519 seed or a 64-byte private key", len(b))
}

// ParseVerifyKey reads AUDIT_VERIFY_KEY: standard base64 of the 32-byte
// Ed25519 public key.
func ParseVerifyKey(s string) (ed25519.PublicKey, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, errors.New("not standard base64")
	}
	if len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%d bytes: want a 32-byte Ed25519 public key", len(b))
	}
	return ed25519.PublicKey(b), nil
}

// RowQuerier reads one row (a pool, a connection or a tx).
type RowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// AnchorQuerier is what an anchor needs: rows to verify and a row to read
// (a pool or a connection).
type AnchorQuerier interface {
	Querier
	RowQuerier
}

// A BrokenChainError is an anchor refused: the chain does not verify, so
// no checkpoint is signed over it (an anchor vouches for the rows up to
// its head).
type BrokenChainError struct {
	Seq     int64
	Problem string
}

func (e *BrokenChainError) Error() string {
	return fmt.Sprintf("audit: anchor: the chain is broken at seq %d (%s): no anchor signed", e.Seq, e.Problem)
}

// NewAnchor verifies the chain and signs its verified head with key. every
// is the interval of a periodic writer (0 on demand). from is the last
// anchor this process wrote, after walking the chain up to it itself (never
// one read back from a file): only the rows after it are walked (its own
// row must still hold its hash); nil walks the whole chain. A chain that
// does not verify gets no anchor (*BrokenChainError): whoever holds the
// application's credentials can append a row, and an anchor signed over a
// forged head would vouch for it.
func NewAnchor(ctx context.Context, q AnchorQuerier, key ed25519.PrivateKey, every time.Duration, from *Anchor) (Anchor, error) {
	var after *int64 // nil: walk every row
	prev := genesis
	if from != nil && from.Seq > 0 {
		h, err := hex.DecodeString(from.Hash)
		if err != nil {
			return Anchor{}, fmt.Errorf("audit: anchor: the last anchor's hash: %w", err)
		}
		var stored []byte
		err = q.QueryRow(ctx, `SELECT hash FROM audit_event WHERE seq = $1`, from.Seq).Scan(&stored)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && !bytes.Equal(stored, h)) {
			return Anchor{}, &BrokenChainError{Seq: from.Seq, Problem: "the row of the last anchor is gone or changed"}
		}
		if err != nil {
			return Anchor{}, fmt.Errorf("audit: anchor: read the last anchor's row: %w", err)
		}
		seq := from.Seq
		after, prev = &seq, h
	}
	res, err := walk(ctx, q, after, prev, 0, nil)
	if err != nil {
		return Anchor{}, fmt.Errorf("audit: anchor: %w", err)
	}
	if !res.Intact() {
		return Anchor{}, &BrokenChainError{Seq: res.FirstBroken, Problem: res.Problem}
	}
	a := Anchor{Hash: hex.EncodeToString(prev)}
	if after != nil {
		a.Seq = *after
	}
	if res.Checked > 0 {
		a.Seq, a.Hash = res.HeadSeq, hex.EncodeToString(res.HeadHash)
	}
	if err := q.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&a.At); err != nil {
		return Anchor{}, fmt.Errorf("audit: anchor: read the clock: %w", err)
	}
	a.At = a.At.UTC().Truncate(time.Microsecond)
	a.EverySeconds = int64(every / time.Second)
	a.Key = KeyID(key.Public().(ed25519.PublicKey))
	a.Sig = base64.StdEncoding.EncodeToString(ed25519.Sign(key, a.signed()))
	return a, nil
}

// WriteAnchor verifies the whole chain, signs its head (NewAnchor) and
// writes it to w as one JSON line.
func WriteAnchor(ctx context.Context, q AnchorQuerier, key ed25519.PrivateKey, every time.Duration, w io.Writer) (Anchor, error) {
	return writeAnchor(ctx, q, key, every, w, nil)
}

func writeAnchor(ctx context.Context, q AnchorQuerier, key ed25519.PrivateKey, every time.Duration, w io.Writer, from *Anchor) (Anchor, error) {
	a, err := NewAnchor(ctx, q, key, every, from)
	if err != nil {
		return Anchor{}, err
	}
	b, _ := json.Marshal(a)
	if _, err := w.Write(append(b, '\n')); err != nil {
		return Anchor{}, fmt.Errorf("audit: write anchor: %w", err)
	}
	return a, nil
}

// AppendAnchor verifies the whole chain, signs its head and writes the
// anchor at the end of the file at path, creating it, and syncs it to disk.
// The file is not read: an anchor in it proves nothing about the rows
// written since (one written before anchors verified, or by anyone who may
// write the file, could name a forged head), so only what this process
// verified itself is a starting point (Anchorer).
func AppendAnchor(ctx context.Context, q AnchorQuerier, key ed25519.PrivateKey, every time.Duration, path string) (Anchor, error) {
	return appendAnchor(ctx, q, key, every, path, nil)
}

func appendAnchor(ctx context.Context, q AnchorQuerier, key ed25519.PrivateKey, every time.Duration, path string, from *Anchor) (Anchor, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return Anchor{}, fmt.Errorf("audit: anchor file: %w", err)
	}
	a, err := writeAnchor(ctx, q, key, every, f, from)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return a, err
}

// Anchorer appends an anchor to File at once and then every Every, until
// its context ends: the console's periodic checkpoints. Ship the file
// somewhere the database's administrators cannot write. Its first anchor
// verifies the whole chain, each later one the rows written since the
// anchor before it, which this process verified itself.
type Anchorer struct {
	DB    AnchorQuerier
	Key   ed25519.PrivateKey
	Every time.Duration
	File  string
	Log   *slog.Logger // nil: discarded
}

// Run writes anchors until ctx ends. A failed anchor is logged and the next
// tick tries again (the gap shows in `console audit verify --anchors`); a
// broken chain is logged at every tick and gets no anchor until repaired.
func (a *Anchorer) Run(ctx context.Context) {
	log := a.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := time.NewTicker(a.Every)
	defer t.Stop()
	var from *Anchor
	for {
		an, err := appendAnchor(ctx, a.DB, a.Key, a.Every, a.File, from)
		var broken *BrokenChainError
		switch {
		case err == nil:
			from = &an
			log.Info("audit anchor written", "file", a.File, "seq", an.Seq)
		case ctx.Err() != nil:
			return
		case errors.As(err, &broken):
			log.Error("audit chain broken: no anchor signed", "seq", broken.Seq, "problem", broken.Problem)
		default:
			log.Error("audit anchor failed", "file", a.File, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ReadAnchors reads JSON lines of anchors; blank lines are skipped, and a
// line that is not an anchor is an error naming it.
func ReadAnchors(r io.Reader) ([]Anchor, error) {
	sc := bufio.NewScanner(r)
	var out []Anchor
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var a Anchor
		if err := json.Unmarshal(line, &a); err != nil || a.Sig == "" || a.Hash == "" {
			return nil, fmt.Errorf("audit: anchors: line %d is not an anchor", n)
		}
		a.Line = n
		out = append(out, a)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("audit: anchors: %w", err)
	}
	return out, nil
}

// AnchorReport is the outcome of checking anchors against the chain.
type AnchorReport struct {
	Checked  int      // anchors read
	Problems []string // each names an anchor: forged, or its head missing or different
	Warnings []string // gaps between periodic anchors
}

// OK reports whether every anchor is genuine and still held by the chain.
func (r AnchorReport) OK() bool { return len(r.Problems) == 0 }

// CheckAnchors verifies each anchor's signature with pub and that the chain
// still holds a row at the anchor's seq with the anchor's hash: a missing
// row means rows were deleted (the tail truncated), a different hash means
// the chain was rewritten and its hashes recomputed. Together with Verify
// (every link intact) this proves nothing up to the newest anchor changed.
// Periodic anchors further apart than twice their declared interval are
// reported as warnings: checkpoints were missed.
func CheckAnchors(ctx context.Context, q Querier, anchors []Anchor, pub ed25519.PublicKey) (AnchorReport, error) {
	rep := AnchorReport{Checked: len(anchors)}
	keyID := KeyID(pub)
	var seqs []int64
	genuine := make([]Anchor, 0, len(anchors))
	for _, a := range anchors {
		sig, err := base64.StdEncoding.DecodeString(a.Sig)
		if err != nil || !ed25519.Verify(pub, a.signed(), sig) {
			why := "its signature does not verify (forged or altered)"
			if a.Key != keyID {
				why = fmt.Sprintf("it was signed by key %s, not the verify key %s", a.Key, keyID)
			}
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %s", a, why))
			continue
		}
		genuine = append(genuine, a)
		if a.Seq > 0 {
			seqs = append(seqs, a.Seq)
		}
	}
	held := map[int64][]byte{}
	if len(seqs) > 0 {
		rows, err := q.Query(ctx, `SELECT seq, hash FROM audit_event WHERE seq = ANY($1)`, seqs)
		if err != nil {
			return AnchorReport{}, fmt.Errorf("audit: check anchors: %w", err)
		}
		var (
			seq  int64
			hash []byte
		)
		_, err = pgx.ForEachRow(rows, []any{&seq, &hash}, func() error {
			held[seq] = hash
			return nil
		})
		if err != nil {
			return AnchorReport{}, fmt.Errorf("audit: check anchors: %w", err)
		}
	}
	for _, a := range genuine {
		if a.Seq == 0 {
			continue // the chain was empty then: nothing to hold
		}
		hash, ok := held[a.Seq]
		switch {
		case !ok:
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: the chain no longer holds seq %d (rows were deleted or the chain truncated)", a, a.Seq))
		case hex.EncodeToString(hash) != a.Hash:
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: the row at seq %d has hash %x, the anchor %s (the chain was rewritten and its hashes recomputed)", a, a.Seq, hash, a.Hash))
		}
	}
	var periodic []Anchor
	for _, a := range genuine {
		if a.EverySeconds > 0 {
			periodic = append(periodic, a)
		}
	}
	sort.SliceStable(periodic, func(i, j int) bool { return periodic[i].At.Before(periodic[j].At) })
	for i := 1; i < len(periodic); i++ {
		prev, next := periodic[i-1], periodic[i]
		every := time.Duration(prev.EverySeconds) * time.Second
		if gap := next.At.Sub(prev.At); gap > 2*every {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("gap in periodic anchors: %s after the previous one at %s (declared every %s)",
				gap.Round(time.Second), prev.At.UTC().Format(time.RFC3339), every))
		}
	}
	return rep, nil
}
