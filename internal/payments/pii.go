package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/pii"
)

// The payment's customer column holds pii envelopes bound to the payment:
// place (CustomerTable, operation id), field name|email|tax_id. A value
// copied to another payment or field does not open there.
const CustomerTable = "payment"

// CustomerPlace is where a payment's customer fields live.
func CustomerPlace(op uuid.UUID) pii.Place {
	return pii.Place{Kind: CustomerTable, ID: op.String()}
}

// ErrInvalidSearch reports a customer search that cannot be run.
var ErrInvalidSearch = errors.New("payments: invalid customer search")

// CheckCustomerSearch says whether FindByCustomer can run a search for
// typed in field (ErrInvalidSearch when not), without running it.
func CheckCustomerSearch(field, typed string) error {
	if _, ok := searchColumns[field]; !ok {
		return fmt.Errorf("%w: field must be %s or %s", ErrInvalidSearch, pii.FieldEmail, pii.FieldTaxID)
	}
	if pii.Normalize(field, typed) == "" {
		return fmt.Errorf("%w: the %s to look for is empty", ErrInvalidSearch, field)
	}
	return nil
}

// SearchPage is one step of a customer search's keyset walk: the rows
// after After, at most Limit.
type SearchPage struct {
	After uuid.UUID // zero: from the start
	Limit int       // 0: DefaultPageLimit; at most MaxPageLimit
}

// Page limits.
const (
	DefaultPageLimit = 50
	MaxPageLimit     = 500
)

// searchColumns are the blind-index columns a search may use, by field;
// the column name comes from here, never from the caller.
var searchColumns = map[string]string{
	pii.FieldEmail: "customer_email_bidx",
	pii.FieldTaxID: "customer_tax_id_bidx",
}

// FindByCustomer finds the payments of the customer whose email or tax id
// (field) an operator typed, without any clear value in the query: the
// typed value is normalised (trimmed; email lower-cased; spaces, dashes and
// dots dropped from a tax id) and looked up by its blind index, in
// operation id order from page.After. The caller audits the search with
// kr.SearchHash, never with the typed value or the blind index.
func FindByCustomer(ctx context.Context, q db.Querier, kr *pii.Keyring, field, typed string, page SearchPage) ([]Payment, error) {
	if err := CheckCustomerSearch(field, typed); err != nil {
		return nil, err
	}
	col := searchColumns[field]
	switch {
	case page.Limit == 0:
		page.Limit = DefaultPageLimit
	case page.Limit < 0 || page.Limit > MaxPageLimit:
		return nil, fmt.Errorf("%w: limit must be 1–%d", ErrInvalidSearch, MaxPageLimit)
	}
	rows, err := q.Query(ctx, `SELECT `+paymentCols+` FROM payment
		WHERE `+col+` = $1 AND operation_id > $2 ORDER BY operation_id LIMIT $3`,
		kr.BlindIndex(field, typed), page.After, page.Limit)
	if err != nil {
		return nil, fmt.Errorf("payments: find by customer %s: %w", field, err)
	}
	return collectPayments(rows, "find by customer "+field)
}

// RotateOptions tune RotateCustomers.
type RotateOptions struct {
	Batch  int  // rows per transaction (default 500)
	DryRun bool // count, change nothing
	// Progress, when set, is called after each batch commits with the rows
	// done so far (the test hook that stops a rotation halfway, too).
	Progress func(done int64)
}

// RotateReport is what a rotation did (or, dry, would do).
type RotateReport struct {
	Rows      int64 // rows that needed work and were visited
	Rewritten int64 // values rewritten under the primary key as v2
	Indexed   int64 // tax id blind indexes filled in (rows older than the column)
	Failed    int64 // values that do not open with this keyring: left as they are
}

// staleCustomers selects the payments with a customer value that is not a
// v2 envelope under the primary key ($1 is its prefix), or a tax id
// without its blind index. Rows already done never match again, so a
// rotation stopped halfway resumes where it stopped.
const staleCustomers = `(EXISTS (SELECT 1 FROM jsonb_each_text(customer) e WHERE left(e.value, length($1)) <> $1)
	OR (customer ? 'tax_id' AND customer_tax_id_bidx IS NULL))`

// CountStaleCustomers counts the payments RotateCustomers would visit.
func CountStaleCustomers(ctx context.Context, q db.Querier, kr *pii.Keyring) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, `SELECT count(*) FROM payment WHERE `+staleCustomers, currentPrefix(kr)).Scan(&n); err != nil {
		return 0, fmt.Errorf("payments: count customers to rotate: %w", err)
	}
	return n, nil
}

func currentPrefix(kr *pii.Keyring) string { return "enc:v2:" + kr.PrimaryKeyID() + ":" }

// RotateCustomers rewrites every customer value not under the primary key,
// and every v1 value, as a v2 envelope under the primary key, and fills in
// missing tax id blind indexes: in batches of opts.Batch rows, one short
// transaction each, walking the primary key. A value is opened before it is
// rewritten and left untouched when it does not open, so nothing is lost;
// a cancelled rotation keeps the batches it committed, and running it again
// finishes the rest.
func RotateCustomers(ctx context.Context, b db.Beginner, kr *pii.Keyring, opts RotateOptions) (RotateReport, error) {
	if opts.Batch == 0 {
		opts.Batch = 500
	}
	if opts.Batch < 0 || opts.Batch > db.MaxDeleteBatch {
		return RotateReport{}, fmt.Errorf("payments: rotate: batch must be 1–%d rows (got %d)", db.MaxDeleteBatch, opts.Batch)
	}
	lock := " FOR NO KEY UPDATE"
	if opts.DryRun {
		lock = ""
	}
	var rep RotateReport
	after := uuid.Nil
	for {
		var n int
		err := db.WithTx(ctx, b, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `SELECT operation_id, customer, customer_tax_id_bidx IS NULL FROM payment
				WHERE operation_id > $2 AND `+staleCustomers+` ORDER BY operation_id LIMIT $3`+lock,
				currentPrefix(kr), after, opts.Batch)
			if err != nil {
				return fmt.Errorf("read: %w", err)
			}
			type row struct {
				op       uuid.UUID
				customer map[string]string
				noTaxIdx bool
			}
			batch, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
				var x row
				var raw []byte
				if err := r.Scan(&x.op, &raw, &x.noTaxIdx); err != nil {
					return x, err
				}
				return x, json.Unmarshal(raw, &x.customer)
			})
			if err != nil {
				return fmt.Errorf("read: %w", err)
			}
			n = len(batch)
			for _, r := range batch {
				after = r.op
				changed := false
				var taxIdx []byte
				for field, env := range r.customer {
					out, did, err := kr.Reseal(CustomerPlace(r.op), field, env)
					if err != nil {
						rep.Failed++
						continue
					}
					if did {
						rep.Rewritten++
						r.customer[field], changed = out, true
					}
					if field == pii.FieldTaxID && r.noTaxIdx {
						clear, err := kr.Open(CustomerPlace(r.op), field, out)
						if err == nil && pii.Normalize(field, clear) != "" {
							taxIdx = kr.BlindIndex(field, clear)
							rep.Indexed++
						}
					}
				}
				rep.Rows++
				if opts.DryRun || !changed && taxIdx == nil {
					continue
				}
				custJSON, err := json.Marshal(r.customer)
				if err != nil {
					return fmt.Errorf("encode the customer of %s: %w", r.op, err)
				}
				if _, err := tx.Exec(ctx, `UPDATE payment SET customer = $2, customer_tax_id_bidx = coalesce(customer_tax_id_bidx, $3)
					WHERE operation_id = $1`, r.op, custJSON, taxIdx); err != nil {
					return fmt.Errorf("update %s: %w", r.op, err)
				}
			}
			return nil
		})
		if err != nil {
			return rep, fmt.Errorf("payments: rotate customers after %s: %w", after, err)
		}
		if opts.Progress != nil {
			opts.Progress(rep.Rows)
		}
		if n < opts.Batch {
			return rep, nil
		}
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("payments: rotate customers: stopped after %d rows: %w", rep.Rows, err)
		}
	}
}

// CensusCustomers opens every customer value and counts it by key id and
// envelope version (`console pii check`), reading batch rows per statement
// in primary key order.
func CensusCustomers(ctx context.Context, q db.Querier, kr *pii.Keyring, batch int) (pii.Census, error) {
	if batch <= 0 {
		batch = 500
	}
	var c pii.Census
	after := uuid.Nil
	for {
		rows, err := q.Query(ctx, `SELECT operation_id, customer FROM payment
			WHERE operation_id > $1 AND customer <> '{}'::jsonb ORDER BY operation_id LIMIT $2`, after, batch)
		if err != nil {
			return c, fmt.Errorf("payments: census of customers: %w", err)
		}
		n := 0
		var op uuid.UUID
		var raw []byte
		_, err = pgx.ForEachRow(rows, []any{&op, &raw}, func() error {
			n++
			after = op
			var customer map[string]string
			if err := json.Unmarshal(raw, &customer); err != nil {
				return fmt.Errorf("customer of %s: %w", op, err)
			}
			for field, env := range customer {
				c.Add(kr, CustomerPlace(op), field, env)
			}
			return nil
		})
		if err != nil {
			return c, fmt.Errorf("payments: census of customers: %w", err)
		}
		if n < batch {
			return c, nil
		}
	}
}
