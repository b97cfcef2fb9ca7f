package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/payments"
)

const merchantsUsage = `Usage: console merchants <verb> [flags]

Merchants of the payments API, their accounts and their API keys. A merchant
calls the API with Authorization: Bearer <key>; a payment may debit only the
merchant's own accounts.

  add ID [--name N] [--account A,B]   add a merchant (and give it existing, unowned accounts)
  assign ID --account A,B             give existing, unowned accounts to a merchant
  keys ID                             list the merchant's keys: id, created, revoked (never the secret)
  keys ID --new                       create a key and print it once (stored hashed: it cannot be shown again)
  revoke KEY_ID                       revoke a key at once (requests with it get 401)

Keys rotate: create a new key, move the client to it, then revoke the old one.
Flags may come before or after the verb; every verb needs DATABASE_URL (or --database-url).
Per-invocation flags (--name, --account, --new) have no environment twin, so a
variable left set never repeats an action by itself.
`

func runMerchants(ctx context.Context, e env, args []string) error {
	// Each verb registers its own flags (--name, --account, --new), so each
	// says which of them take a value: with none of them known, a value
	// before the verb was read as the verb.
	verb, args, found := verbAmongFlags(args, &config.Merchants{Verb: "add"}, &config.Merchants{Verb: "assign"},
		&config.Merchants{Verb: "keys"}, &config.Merchants{Verb: "revoke"})
	switch {
	case !found && askedForHelp(args), verb == "help":
		fmt.Fprint(e.stdout, merchantsUsage)
		return config.ErrHelp
	case !found:
		fmt.Fprint(e.stderr, merchantsUsage)
		return &config.UsageError{Err: errors.New("want a verb: add, assign, keys or revoke")}
	}
	switch verb {
	case "add", "assign", "keys", "revoke":
	default:
		return &config.UsageError{Err: fmt.Errorf("unknown verb %q (want add, assign, keys or revoke)", verb)}
	}
	c := config.Merchants{Verb: verb}
	var accounts []int64
	usage := func(pos []string) (err error) {
		if len(pos) != 1 {
			what := "a merchant ID"
			if verb == "revoke" {
				what = "a KEY_ID"
			}
			return fmt.Errorf("merchants %s wants exactly one argument, %s (got %d)", verb, what, len(pos))
		}
		if accounts, err = parseAccounts(c.Accounts); err != nil {
			return err
		}
		if verb == "assign" && len(accounts) == 0 {
			return errors.New("merchants assign wants --account A[,B…]")
		}
		return nil
	}
	pos, err := configure(e, "merchants "+verb, verbSummary(merchantsUsage), &c, args, usage)
	if err != nil {
		return err
	}
	pool, err := db.OpenCurrent(ctx, c.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	id := pos[0]
	switch verb {
	case "add":
		// One transaction: a refused account (missing, another merchant's)
		// leaves no merchant behind, so the command that failed changed
		// nothing and can be run again as it is once corrected.
		err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
			if err := payments.CreateMerchant(ctx, tx, id, c.Name); err != nil {
				return err
			}
			for _, a := range accounts {
				if err := payments.AssignAccount(ctx, tx, id, a); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("%w (merchant %s not added)", err, id)
		}
		fmt.Fprintf(e.stdout, "merchant %s added\n", id)
		for _, a := range accounts {
			fmt.Fprintf(e.stdout, "account %d belongs to merchant %s\n", a, id)
		}
		fmt.Fprintf(e.stdout, "create its first API key with: console merchants keys %s --new\n", id)
	case "assign":
		if _, err := payments.GetMerchant(ctx, pool, id); err != nil {
			return fmt.Errorf("merchant %s: %w", id, err)
		}
		return assignAccounts(ctx, e, pool, id, accounts)
	case "keys":
		if _, err := payments.GetMerchant(ctx, pool, id); err != nil {
			return fmt.Errorf("merchant %s: %w", id, err)
		}
		if c.NewKey {
			key, k, err := payments.CreateKey(ctx, pool, id)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "key_id %s\nkey    %s\n", k.KeyID, key)
			fmt.Fprintln(e.stderr, "Store this key now: it is shown only this once (the database keeps its SHA-256 hash).")
			return nil
		}
		keys, err := payments.ListKeys(ctx, pool, id)
		if err != nil {
			return err
		}
		fmt.Fprintln(e.stdout, "KEY_ID\tCREATED\tREVOKED")
		for _, k := range keys {
			revoked := "-"
			if k.RevokedAt != nil {
				revoked = k.RevokedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(e.stdout, "%s\t%s\t%s\n", k.KeyID, k.CreatedAt.UTC().Format(time.RFC3339), revoked)
		}
	case "revoke":
		k, err := payments.RevokeKey(ctx, pool, id)
		if err != nil {
			return fmt.Errorf("key %s: %w", id, err)
		}
		fmt.Fprintf(e.stdout, "key %s of merchant %s revoked at %s\n", k.KeyID, k.MerchantID, k.RevokedAt.UTC().Format(time.RFC3339))
	}
	return nil
}

// assignAccounts gives every account or none (one refused, none moves).
func assignAccounts(ctx context.Context, e env, pool *pgxpool.Pool, merchant string, accounts []int64) error {
	err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		for _, a := range accounts {
			if err := payments.AssignAccount(ctx, tx, merchant, a); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w (no account assigned)", err)
	}
	for _, a := range accounts {
		fmt.Fprintf(e.stdout, "account %d belongs to merchant %s\n", a, merchant)
	}
	return nil
}

func parseAccounts(s string) ([]int64, error) {
	var out []int64
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("--account: %q is not an account id (a positive whole number)", a)
		}
		out = append(out, n)
	}
	return out, nil
}
