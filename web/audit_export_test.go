package web_test

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"io"
	"net/http"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/audit/audittest"
)

func TestAuditExportFormatsAndFormulaCells(t *testing.T) {
	t.Parallel()
	h := start(t, options{})
	formulas := []string{"=HYPERLINK(\"http://evil\")", "+1+1", "-2+3", "@SUM(A1)", "\tx", "\rx"}
	var want []int64
	for i, f := range formulas {
		want = append(want, record(t, h, audit.Event{ActorSub: "sub-e", ActorName: f, Action: "test.export",
			TargetType: "thing", TargetID: f, Reason: f, UserAgent: f, After: json.RawMessage(`{"i": ` + strconv.Itoa(i) + `}`)})...)
	}
	record(t, h, audit.Event{ActorSub: "sub-other", Action: "test.other"})
	b, _ := h.signedIn(t, "auditor")

	resp, body := b.get(t, h.base+"/audit/export?format=csv&action=test.export", "")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/csv; charset=utf-8" ||
		!strings.HasPrefix(resp.Header.Get("Content-Disposition"), `attachment; filename="sluice-audit-`) ||
		!strings.HasSuffix(resp.Header.Get("Content-Disposition"), `.csv"`) || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("csv: %d %v", resp.StatusCode, resp.Header)
	}
	recs, err := csv.NewReader(strings.NewReader(body)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(formulas)+1 || recs[0][0] != "seq" || recs[0][20] != "hash" {
		t.Fatalf("csv: %d records, header %v", len(recs), recs[0])
	}
	col := map[string]int{}
	for i, name := range recs[0] {
		col[name] = i
	}
	for i, r := range recs[1:] {
		if r[col["seq"]] != strconv.FormatInt(want[i], 10) { // oldest first
			t.Errorf("row %d: seq %s, want %d", i, r[col["seq"]], want[i])
		}
		for _, name := range []string{"actor_name", "target_id", "reason", "user_agent"} {
			if got := r[col[name]]; got != "'"+formulas[i] {
				t.Errorf("row %d %s: %q, want it neutralized as %q", i, name, got, "'"+formulas[i])
			}
		}
		if r[col["after"]] != `{"i": `+strconv.Itoa(i)+`}` || len(r[col["hash"]]) != 64 || r[col["before"]] != "" {
			t.Errorf("row %d: after %q hash %q before %q", i, r[col["after"]], r[col["hash"]], r[col["before"]])
		}
	}

	resp, body = b.get(t, h.base+"/audit/export?format=jsonl&actor=sub-e", "")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson; charset=utf-8" ||
		!strings.HasSuffix(resp.Header.Get("Content-Disposition"), `.jsonl"`) {
		t.Fatalf("jsonl: %d %v", resp.StatusCode, resp.Header)
	}
	lines := strings.Split(strings.TrimSuffix(body, "\n"), "\n")
	if len(lines) != len(formulas) {
		t.Fatalf("jsonl: %d lines", len(lines))
	}
	for i, l := range lines {
		var row struct {
			Seq       int64           `json:"seq"`
			ActorName string          `json:"actor_name"`
			After     json.RawMessage `json:"after"`
			Before    json.RawMessage `json:"before"`
			Hash      string          `json:"hash"`
		}
		if err := json.Unmarshal([]byte(l), &row); err != nil {
			t.Fatal(err)
		}
		if row.Seq != want[i] || row.ActorName != formulas[i] || string(row.Before) != "null" || len(row.Hash) != 64 {
			t.Errorf("line %d: %+v", i, row)
		}
	}

	// Each export is audited, with its format and filter, before it streams.
	if n := h.countAudit(t, `action = 'audit.export' AND actor_name = 'auditor' AND outcome = 'ok' AND target_id = 'csv'
		AND after->'filter'->>'action' = 'test.export'`); n != 1 {
		t.Errorf("csv export audited %d times", n)
	}
	if n := h.countAudit(t, `action = 'audit.export' AND target_id = 'jsonl' AND after->'filter'->>'actor' = 'sub-e'`); n != 1 {
		t.Errorf("jsonl export audited %d times", n)
	}
	for _, q := range []string{"?format=xml", "", "?format=csv&outcome=maybe", "?format=csv&target_id=x"} {
		if resp, _ := b.get(t, h.base+"/audit/export"+q, ""); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("export%s: %d, want 400", q, resp.StatusCode)
		}
	}
}

// exportRows is the size of the bounded-memory export test's trail.
const exportRows = 1_000_000

// TestAuditExportBoundedMemory streams a large trail in both formats and
// checks that the process's heap stays far below the export's size: the
// export is streamed, never held. It is not parallel, so the heap it
// samples is this export's (parallel tests start after it ends).
func TestAuditExportBoundedMemory(t *testing.T) {
	h := start(t, options{})
	// Rows straight into the table (the export does not need a valid chain).
	began := time.Now()
	audittest.Bulk(t, h.pool, exportRows)
	t.Logf("inserted %d audit rows in %s", exportRows, time.Since(began).Round(time.Millisecond))
	b, _ := h.signedIn(t, "auditor")

	old := debug.SetGCPercent(20) // the heap then follows what is live
	defer debug.SetGCPercent(old)
	const bound = 32 << 20
	for _, format := range []string{"csv", "jsonl"} {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		base := ms.HeapAlloc
		var peak atomic.Uint64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			var ms runtime.MemStats
			for {
				runtime.ReadMemStats(&ms)
				if ms.HeapAlloc > peak.Load() {
					peak.Store(ms.HeapAlloc)
				}
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		})
		began := time.Now()
		req, _ := http.NewRequest(http.MethodGet, h.base+"/audit/export?format="+format+"&action=outbox.retry", nil)
		stream := *b.Client
		stream.Timeout = 0 // a download of hundreds of MB: no overall deadline
		resp, err := stream.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", format, resp.StatusCode)
		}
		// Read as a client would, line by line, without keeping it.
		var size, lines int64
		r := bufio.NewReaderSize(resp.Body, 64<<10)
		for {
			line, err := r.ReadSlice('\n')
			size += int64(len(line))
			if len(line) > 0 && line[len(line)-1] == '\n' {
				lines++
			}
			if err == io.EOF {
				break
			}
			if err != nil && err != bufio.ErrBufferFull {
				t.Fatal(err)
			}
		}
		resp.Body.Close()
		close(stop)
		wg.Wait()
		growth := int64(peak.Load()) - int64(base)
		t.Logf("%s: %d rows, %d MB in %s; heap growth at most %.1f MB", format, lines, size>>20,
			time.Since(began).Round(time.Millisecond), float64(growth)/(1<<20))
		wantLines := int64(exportRows)
		if format == "csv" {
			wantLines++ // the header
		}
		if lines != wantLines || size < 100<<20 {
			t.Errorf("%s: %d lines, %d bytes; want %d lines and more than 100 MB", format, lines, size, wantLines)
		}
		if growth > bound {
			t.Errorf("%s: the heap grew by %d MB while streaming %d MB (bound %d MB)", format, growth>>20, size>>20, bound>>20)
		}
	}
}
