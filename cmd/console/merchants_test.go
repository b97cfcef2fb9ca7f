package main

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/shopspring/decimal"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/db/dbtest"
	"github.com/sluice-dev/sluice/internal/payments"
)

var newKeyLine = regexp.MustCompile(`(?m)^key    (slk_([0-9a-f]{16})_[0-9a-f]{64})$`)

// `console merchants`: add a merchant with an account (flags after the
// verb), create a key printed once, list keys without secrets, revoke, and
// refuse to take another merchant's account. The key authenticates until it
// is revoked.
func TestMerchantsCommand(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	ctx := context.Background()
	pool, err := db.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, id := range []int64{7, 8, 9} {
		if err := payments.CreateAccount(ctx, pool, "", id, "TRY", decimal.New(100, 0)); err != nil {
			t.Fatal(err)
		}
	}
	envs := map[string]string{"DATABASE_URL": url}
	if code, out, stderr := runConsole(t, envs, "merchants", "add", "shop-1", "--name", "Shop One", "--account", "7"); code != 0 ||
		!strings.Contains(out, "merchant shop-1 added") || !strings.Contains(out, "account 7 belongs to merchant shop-1") {
		t.Fatalf("add: code %d out %q stderr %q", code, out, stderr)
	}
	// A refused account adds no merchant: the failed command changed
	// nothing, and runs as it is once corrected.
	for _, account := range []string{"7", "8,7", "999"} {
		code, out, stderr := runConsole(t, envs, "merchants", "add", "shop-2", "--account", account)
		if code != 1 || strings.Contains(out, "added") || !strings.Contains(stderr, "merchant shop-2 not added") {
			t.Fatalf("add with account(s) %s (another merchant's or none): code %d out %q stderr %q", account, code, out, stderr)
		}
		if _, err := payments.GetMerchant(ctx, pool, "shop-2"); !errors.Is(err, payments.ErrNotFound) {
			t.Fatalf("a refused add (account %s) left the merchant behind: %v", account, err)
		}
	}
	if code, out, stderr := runConsole(t, envs, "merchants", "add", "shop-2", "--account", "8"); code != 0 || !strings.Contains(out, "account 8 belongs to merchant shop-2") {
		t.Fatalf("add: code %d out %q stderr %q", code, out, stderr)
	}
	// assign is all or nothing too.
	if code, out, stderr := runConsole(t, envs, "merchants", "assign", "shop-2", "--account", "9,7"); code != 1 || strings.Contains(out, "belongs") {
		t.Fatalf("assign with another merchant's account: code %d out %q stderr %q", code, out, stderr)
	}
	if accounts, err := payments.MerchantAccounts(ctx, pool, "shop-2"); err != nil || len(accounts) != 1 || accounts[0] != 8 {
		t.Fatalf("a refused assign moved accounts: shop-2 owns %v (%v), want only 8", accounts, err)
	}
	if code, out, stderr := runConsole(t, envs, "merchants", "assign", "shop-2", "--account", "9"); code != 0 || !strings.Contains(out, "account 9 belongs to merchant shop-2") {
		t.Fatalf("assign: code %d out %q stderr %q", code, out, stderr)
	}
	code, out, stderr := runConsole(t, envs, "merchants", "keys", "shop-1", "--new")
	m := newKeyLine.FindStringSubmatch(out)
	if code != 0 || m == nil || !strings.Contains(stderr, "shown only this once") {
		t.Fatalf("keys --new: code %d out %q stderr %q", code, out, stderr)
	}
	key, keyID := m[1], m[2]
	if merchant, _, err := payments.Authenticate(ctx, pool, key); err != nil || merchant != "shop-1" {
		t.Fatalf("the printed key does not authenticate shop-1: %q %v", merchant, err)
	}
	code, out, _ = runConsole(t, envs, "merchants", "keys", "shop-1")
	if code != 0 || !strings.Contains(out, keyID) || strings.Contains(out, key[len(key)-64:]) {
		t.Fatalf("keys: code %d out %q (want the key id and never the secret)", code, out)
	}
	if code, out, _ := runConsole(t, envs, "merchants", "revoke", keyID); code != 0 || !strings.Contains(out, "revoked") {
		t.Fatalf("revoke: code %d out %q", code, out)
	}
	if _, _, err := payments.Authenticate(ctx, pool, key); err == nil {
		t.Fatal("a revoked key still authenticates")
	}
	if code, _, _ := runConsole(t, envs, "merchants", "revoke", "0123456789abcdef"); code != 1 {
		t.Fatalf("revoke an unknown key: code %d, want 1", code)
	}
	if code, _, _ := runConsole(t, envs, "merchants", "keys", "no-such-merchant", "--new"); code != 1 {
		t.Fatalf("keys for an unknown merchant: code %d, want 1", code)
	}
	// Usage errors and help: exit 2 / 0, and help touches nothing.
	for _, args := range [][]string{{"merchants"}, {"merchants", "frobnicate"}, {"merchants", "add"}, {"merchants", "assign", "shop-1"}, {"merchants", "add", "x", "--account", "seven"}} {
		if code, _, _ := runConsole(t, envs, args...); code != 2 {
			t.Errorf("%v: code %d, want 2", args, code)
		}
	}
	for _, args := range [][]string{{"merchants", "--help"}, {"merchants", "add", "--help"}, {"merchants", "keys", "shop-1", "--new", "--help"}} {
		if code, _, _ := runConsole(t, envs, args...); code != 0 {
			t.Errorf("%v: code %d, want 0", args, code)
		}
	}
	keys, err := payments.ListKeys(ctx, pool, "shop-1")
	if err != nil || len(keys) != 1 {
		t.Fatalf("--help created a key or listing failed: %d keys, %v", len(keys), err)
	}
}
