package auth

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/db"
)

// Requests refused before anyone signed in (a cross-site POST, an anonymous
// POST, signing out without a session) are not staff actions: anyone on the
// network can send them, so recording each as a permanent, hash-chained
// audit row would let a stranger grow the trail without bound. They are
// counted (metrics) and written, rate-limited per client IP, to the
// prunable refusal log instead. A signed-in user's refusal stays in the
// audit chain (RecordDenied).

// RefusalRetention is how long `console prune` keeps refusal-log rows.
const RefusalRetention = 7 * 24 * time.Hour

// RefusalsPerIP is how many refusal-log rows one client IP may add per
// minute; further refusals are only counted.
const RefusalsPerIP = 10

// Refusals is the refusal log.
type Refusals struct {
	Pool *pgxpool.Pool
	// Limit caps the rows per client IP (nil: every refusal is written).
	Limit *IPLimiter
	// Counted is told about every refusal, written or not (metrics); may
	// be nil.
	Counted func(reason string)
}

// NewRefusals is the console's refusal log: RefusalsPerIP rows per IP per
// minute on the clock now.
func NewRefusals(pool *pgxpool.Pool, now func() time.Time, counted func(reason string)) *Refusals {
	return &Refusals{Pool: pool, Limit: NewIPLimiter(RefusalsPerIP, time.Minute, now), Counted: counted}
}

// Record counts a refusal of a request without a session and, within its
// IP's limit, writes it. route is the method and route template, never the
// raw URL; nothing from cookies, headers or the body is kept.
func (r *Refusals) Record(ctx context.Context, meta RequestMeta, route, reason string) error {
	if r.Counted != nil {
		r.Counted(reason)
	}
	if r.Limit != nil && !r.Limit.Allow(meta.IP) {
		return nil
	}
	// A cancelled request (the client went away) still leaves its trace.
	_, err := r.Pool.Exec(context.WithoutCancel(ctx),
		`INSERT INTO console_refusal (route, reason, ip, request_id) VALUES ($1, $2, $3, $4)`, route, reason, meta.IP, meta.RequestID)
	if err != nil {
		return fmt.Errorf("auth: refusal log: %w", err)
	}
	return nil
}

// PruneRefusals deletes refusal-log rows older than RefusalRetention before
// now (the database clock), in batches.
func PruneRefusals(ctx context.Context, q db.Querier, now time.Time, batch int) (int64, error) {
	return db.DeleteInBatches(ctx, q, "prune refusal log", `
		DELETE FROM console_refusal WHERE refusal_id IN (
			SELECT refusal_id FROM console_refusal WHERE refused_at < $1 ORDER BY refused_at LIMIT $2)`,
		now.Add(-RefusalRetention), batch)
}

// Refused records a refusal made outside Require (the cross-origin check in
// front of the router): in the audit chain when the request's cookie names
// a live session, else in the refusal log. The session is only read: a
// refused request does not keep it alive.
func (g *Guard) Refused(c echo.Context, route, reason string) error {
	var meta RequestMeta
	if g.Meta != nil {
		meta = g.Meta(c)
	}
	ctx := c.Request().Context()
	if ck, err := c.Cookie(g.Cookies.Session); err == nil && ck.Value != "" {
		sess, err := g.Sessions.Peek(ctx, ck.Value)
		switch {
		case err == nil:
			return g.RecordDenied(ctx, sess, meta, route, reason)
		case !errors.Is(err, ErrNoSession):
			return err
		}
	}
	return g.refusals().Record(ctx, meta, route, reason)
}

func (g *Guard) refusals() *Refusals {
	if g.Refusals != nil {
		return g.Refusals
	}
	return &Refusals{Pool: g.Pool}
}
