package main

import (
	"context"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/demo/devoidc"
	"github.com/sluice-dev/sluice/internal/testkit"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// `console serve` wired for real: it discovers the provider, refuses
// nothing, serves health, readiness, metrics and the login redirect, and
// stops cleanly when its context ends.
func TestServeRunsAndStops(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	base := "http://" + addr
	idp, err := devoidc.Start(context.Background(), devoidc.Config{Addr: "127.0.0.1:0", ClientID: "console", ClientSecret: "s",
		RedirectURIs: []string{base + "/auth/callback"}})
	if err != nil {
		t.Fatal(err)
	}
	defer idp.Close()
	envs := map[string]string{
		"DATABASE_URL": dbtest.URL(t), "CONSOLE_ADDR": addr, "CONSOLE_PUBLIC_URL": base,
		"OIDC_ISSUER": idp.Issuer(), "OIDC_CLIENT_ID": "console", "OIDC_CLIENT_SECRET": "s",
		"CONSOLE_ROLE_MAP": devoidc.DemoRoleMap, "LOG_LEVEL": "warn",
		// Periodic audit anchors: the first is written at start.
		"AUDIT_ANCHOR_FILE": filepath.Join(t.TempDir(), "anchors.jsonl"), "AUDIT_ANCHOR_EVERY": "1h",
		"AUDIT_SIGNING_KEY": base64.StdEncoding.EncodeToString(make([]byte, 32)),
	}
	ctx, cancel := context.WithCancel(context.Background())
	type result struct {
		code           int
		stdout, stderr string
	}
	done := make(chan result, 1)
	go func() {
		code, out, errOut := runConsoleCtx(ctx, envs, "serve")
		done <- result{code, out, errOut}
	}()
	client := &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string) (int, string) {
		resp, err := client.Get(base + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Location") + string(b)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if code, _ := get("/healthz"); code == 200 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			r := <-done
			t.Fatalf("serve never answered: exit %d, stderr %s", r.code, r.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, _ := get("/readyz"); code != 200 {
		t.Errorf("readyz %d", code)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "sluice_ws_clients") {
		t.Errorf("metrics %d", code)
	}
	if code, loc := get("/login"); code != http.StatusFound || !strings.HasPrefix(loc, idp.Issuer()) || !strings.Contains(loc, "code_challenge_method=S256") {
		t.Errorf("login %d %s", code, loc)
	}
	testkit.Until(t, "serve's first audit anchor", func() bool {
		b, _ := os.ReadFile(envs["AUDIT_ANCHOR_FILE"])
		return strings.Count(string(b), "\n") == 1
	})
	cancel()
	select {
	case r := <-done:
		if r.code != 0 {
			t.Fatalf("serve exited %d: %s", r.code, r.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop")
	}
	if code, out, errOut := runConsole(t, envs, "audit", "verify"); code != 0 || !strings.Contains(out, "anchors: all 1 held") {
		t.Fatalf("verify serve's anchor: exit %d %q %q", code, out, errOut)
	}
}

func runConsoleCtx(ctx context.Context, envs map[string]string, args ...string) (code int, stdout, stderr string) {
	var out, errb testkit.Buffer
	code = run(ctx, args, env{lookup: config.MapLookup(envs), stdout: &out, stderr: &errb})
	return code, out.String(), errb.String()
}
