package outbox

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/internal/db"
)

// A running relay reports into outbox_relay (migration 00026): when it
// starts, every ReportInterval, and at once when it pauses on a broker
// outage or resumes; it deletes its row when Run returns. The console reads
// the rows (RelaysRead), so the dashboard can tell a backlog that grows
// because relays are paused, or because none runs, from one that is merely
// behind. Before, that lived only in each relay process's /metrics.
//
// A relay that stops without deleting its row (kill -9, its host lost, cut
// off from the database) is silent once the row's expires_at passes, three
// intervals after its last report: two reports may be lost or late (a busy
// pool, a slow commit) before a live relay looks silent. Reports remove rows
// silent for longer than relayForgetAfter, so a killed relay is shown for an
// hour, not for ever.

// DefaultReportInterval is how often a relay reports that it runs.
const DefaultReportInterval = 5 * time.Second

// RelaySilentAfter is how many report intervals without a report make a
// relay silent.
const RelaySilentAfter = 3

// relayForgetAfter is how long a silent relay's row is kept and shown: the
// reads pass over older rows, so a relay killed when no other relay runs to
// delete its row is not shown for ever.
const relayForgetAfter = time.Hour

// forgetInterval is relayForgetAfter as an SQL interval literal.
var forgetInterval = fmt.Sprintf("interval '%d seconds'", int64(relayForgetAfter/time.Second))

// reportSQL writes the relay's row. Rows silent for an hour go in the same
// statement; SKIP LOCKED, so two relays cleaning up at once neither wait for
// nor deadlock on each other. unavailable_since keeps the time of the
// pause's first report while the pause lasts.
const reportSQL = `
WITH now AS (SELECT coalesce($2::timestamptz, statement_timestamp()) AS t),
gone AS (
	DELETE FROM outbox_relay WHERE id IN (
		SELECT id FROM outbox_relay, now
		 WHERE expires_at < now.t - $7::bigint * interval '1 microsecond' AND id <> $1
		   FOR UPDATE SKIP LOCKED))
INSERT INTO outbox_relay AS r (id, name, host, pid, started_at, seen_at, expires_at, unavailable_since, shards, ordered,
                               published, published_at, failed, last_error, last_error_at)
SELECT $1, $3, $4, $5, now.t, now.t, now.t + $6::bigint * interval '1 microsecond', CASE WHEN $8 THEN now.t END, $9, $10,
       $11, now.t - $12::bigint * interval '1 microsecond', $13, $14, now.t - $15::bigint * interval '1 microsecond'
  FROM now
ON CONFLICT (id) DO UPDATE
   SET seen_at = excluded.seen_at, expires_at = excluded.expires_at,
       unavailable_since = CASE WHEN $8 THEN coalesce(r.unavailable_since, excluded.seen_at) END,
       published = excluded.published,
       -- Kept while the count stands: the time is worked out again at each
       -- report, to within the report's own latency, and must not wander.
       published_at = CASE WHEN excluded.published <> r.published OR r.published_at IS NULL
                           THEN excluded.published_at ELSE r.published_at END,
       failed = excluded.failed, last_error = excluded.last_error,
       last_error_at = CASE WHEN excluded.failed <> r.failed OR r.last_error_at IS NULL
                            THEN excluded.last_error_at ELSE r.last_error_at END`

// relayIdentity is what a relay's row says of it besides its state.
type relayIdentity struct {
	id   uuid.UUID
	host string
	pid  int
}

func newRelayIdentity() relayIdentity {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return relayIdentity{id: uuid.New(), host: host, pid: os.Getpid()}
}

// relayFailure is a relay's last failed publish, for its report.
type relayFailure struct {
	text string
	at   time.Time
}

// reportErrorText bounds the error a report carries: the page shows it in
// a table cell, the whole text is in the event's last_error and the log.
const reportErrorText = 300

// report writes the relay's row once. Its last publish and last failure go
// as how long ago they were, by this process's monotonic clock (NULL: none
// yet).
func (r *Relay) report(ctx context.Context) error {
	var sincePublish, sinceFailure *int64
	if at := r.lastPublish.Load(); at != nil {
		us := time.Since(*at).Microseconds()
		sincePublish = &us
	}
	var lastError *string
	if f := r.lastFailure.Load(); f != nil {
		us := time.Since(f.at).Microseconds()
		sinceFailure = &us
		text := f.text
		if len(text) > reportErrorText {
			text = strings.ToValidUTF8(text[:reportErrorText], "") + "…"
		}
		lastError = &text
	}
	_, err := r.pool.Exec(ctx, reportSQL, r.ident.id, r.nowArg(), r.cfg.Name, r.ident.host, r.ident.pid,
		(RelaySilentAfter * r.cfg.ReportInterval).Microseconds(), relayForgetAfter.Microseconds(), r.paused.Load(),
		r.cfg.Shards, !r.cfg.DisableOrdering, r.stats.published.Load(), sincePublish,
		r.stats.failed.Load(), lastError, sinceFailure)
	if err != nil {
		return fmt.Errorf("outbox: relay report: %w", err)
	}
	return nil
}

// reportLoop reports until ctx ends: at once, then every ReportInterval and
// whenever the relay pauses or resumes (reportNow). A failed report is
// logged once per run of failures; the relay goes on publishing meanwhile,
// since the database it reports to is the one it claims from.
func (r *Relay) reportLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.ReportInterval)
	defer t.Stop()
	failing := false
	for {
		rctx, cancel := context.WithTimeout(ctx, r.cfg.ReportInterval)
		err := r.report(rctx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			r.log.Warn("outbox: relay could not report; the console may show it as silent", "err", err)
			failing = true
		case err == nil && failing:
			r.log.Info("outbox: relay reports again")
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.reportNow:
		}
	}
}

// signOff deletes the relay's row when Run returns, so a relay stopped on
// purpose is not shown as silent. ctx is already done by then: the delete
// has its own few seconds.
func (r *Relay) signOff(ctx context.Context) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := r.pool.Exec(dctx, `DELETE FROM outbox_relay WHERE id = $1`, r.ident.id); err != nil {
		r.log.Warn("outbox: relay could not sign off; the console shows it as silent for an hour", "err", err)
	}
}

// Relays is what the relays' reports say, as of one read. The three counts
// partition the rows: a relay is alive (running, or paused) from its first
// report until its row expires (three report intervals without a report),
// and silent from then until a report removes it an hour later.
type Relays struct {
	Running int64 `json:"running"` // reporting and not paused
	// Paused are running but paused on a broker outage: they probe the
	// broker and resume by themselves (sluice_outbox_relays_broker_unavailable
	// in each relay's own metrics).
	Paused      int64     `json:"paused"`
	PausedSince time.Time `json:"paused_since"` // the earliest of their pauses (zero: none)
	// Silent stopped reporting without signing off, within the last hour:
	// killed, their host lost, or cut off from the database.
	Silent     int64     `json:"silent"`
	SilentLast time.Time `json:"silent_last"` // the newest of the silent relays' last reports (zero: none)
	// Shards and Ordered are the distinct OUTBOX_SHARDS and RELAY_ORDERING
	// of the alive relays, ascending: more than one value of either is a
	// misconfiguration (Disagree).
	Shards  []int  `json:"shards"`
	Ordered []bool `json:"ordered"`
	// Failing are running relays whose last failed publish is newer than
	// their last publish, which is two report intervals old
	// (relayFailingSQL): what they try does not go through, and it is not
	// an outage (they would be paused).
	Failing int64 `json:"failing"`
}

// relayFailingSQL is when a relay is failing, on the database's clock: it
// runs (not paused: an outage is not its failure), its last failed publish
// is newer than its last publish, and it has not published for two of its
// report intervals (a third of expires_at − seen_at each). Without that
// margin, a relay that publishes all the time would read as failing
// between a refused event and its next batch. The relays page (RelayRow.
// Failing) and Relays.Failing both use it.
const relayFailingSQL = `(expires_at > now() AND unavailable_since IS NULL
	AND last_error_at > coalesce(published_at, '-infinity')
	AND coalesce(published_at, started_at) < now() - (expires_at - seen_at) * 2 / 3)`

// Disagree reports alive relays that publish differently: on different
// shard counts (a consumer reads one count's subjects or queues, so it never
// sees what the others publish), or some with ordering and some without (an
// aggregate's events may then overtake each other).
func (r Relays) Disagree() bool { return len(r.Shards) > 1 || len(r.Ordered) > 1 }

// Alive is how many relays report: running or paused.
func (r Relays) Alive() int64 { return r.Running + r.Paused }

// RelaysRead reads Relays as a db.Read part, on the database's clock (the
// statement's now(), the snapshot's time): the table holds a row per relay
// and per relay killed in the last hour, so it is read whole.
type RelaysRead struct {
	Relays Relays
}

// Expr implements db.Read.
func (r *RelaysRead) Expr(*db.Args) string {
	return `SELECT json_build_object(
	    'running', count(*) FILTER (WHERE expires_at > now() AND unavailable_since IS NULL),
	    'paused', count(*) FILTER (WHERE expires_at > now() AND unavailable_since IS NOT NULL),
	    'paused_since', min(unavailable_since) FILTER (WHERE expires_at > now()),
	    'silent', count(*) FILTER (WHERE expires_at <= now()),
	    'silent_last', max(seen_at) FILTER (WHERE expires_at <= now()),
	    'shards', coalesce(array_agg(DISTINCT shards ORDER BY shards) FILTER (WHERE expires_at > now()), '{}'),
	    'ordered', coalesce(array_agg(DISTINCT ordered ORDER BY ordered) FILTER (WHERE expires_at > now()), '{}'),
	    'failing', count(*) FILTER (WHERE ` + relayFailingSQL + `))
	  FROM outbox_relay
	 WHERE expires_at >= now() - ` + forgetInterval
}

// Scan implements db.Read.
func (r *RelaysRead) Scan(src []byte) error {
	r.Relays = Relays{}
	if err := db.ScanJSON(src, &r.Relays); err != nil {
		return fmt.Errorf("outbox: relays: %w", err)
	}
	return nil
}

// ReadRelays reads the relays' reports on their own.
func ReadRelays(ctx context.Context, q db.RowQuerier) (Relays, error) {
	var rr RelaysRead
	if _, err := db.ReadAll(ctx, q, &rr); err != nil {
		return Relays{}, err
	}
	return rr.Relays, nil
}

// RelayRow is one relay's report, as the relays page lists it.
type RelayRow struct {
	Name, Host string
	PID        int
	StartedAt  time.Time
	SeenAt     time.Time  // its last report
	Since      *time.Time // paused: since when; silent: its last report (nil when running)
	State      string     // RelayRunning, RelayPaused or RelaySilent, on the database's clock
	Shards     int        // OUTBOX_SHARDS it publishes with (0: unsharded)
	Ordered    bool       // RELAY_ORDERING
	// Published is how many events it has published and marked since it
	// started, PublishedAt when it last marked one (nil: none yet), as of
	// its last report.
	Published   int64
	PublishedAt *time.Time
	// Failed is how many publish attempts failed since it started (broker
	// outages included), LastError the last one's error and LastErrorAt
	// when (nil: none yet), as of its last report.
	Failed      int64
	LastError   string
	LastErrorAt *time.Time
	// Failing: running, its last failure newer than its last publish, and
	// no publish for two report intervals (Relays.Failing counts these).
	Failing bool
}

// The states of a relay's report (Relays counts them).
const (
	RelayRunning = "running"
	RelayPaused  = "paused"
	RelaySilent  = "silent"
)

// relayListLimit bounds the relays page: one row per relay and per relay
// killed in the last hour.
const relayListLimit = 1000

// ListRelays lists the relays' reports, those that need a look first
// (paused, then silent), then by name and host, with the database's time
// they were judged at.
func ListRelays(ctx context.Context, q db.Querier) ([]RelayRow, time.Time, error) {
	rows, err := q.Query(ctx, `
		SELECT name, host, pid, started_at, seen_at,
		       CASE WHEN expires_at <= now() THEN seen_at ELSE unavailable_since END,
		       CASE WHEN expires_at <= now() THEN 'silent' WHEN unavailable_since IS NOT NULL THEN 'paused' ELSE 'running' END,
		       shards, ordered, published, published_at, failed, coalesce(last_error, ''), last_error_at,
		       coalesce(`+relayFailingSQL+`, false), now()
		  FROM outbox_relay
		 WHERE expires_at >= now() - `+forgetInterval+`
		 ORDER BY CASE WHEN expires_at <= now() THEN 1 WHEN unavailable_since IS NOT NULL THEN 0 ELSE 2 END, name, host, pid
		 LIMIT `+db.Int(relayListLimit))
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("outbox: list relays: %w", err)
	}
	defer rows.Close()
	var (
		out []RelayRow
		at  time.Time
	)
	for rows.Next() {
		var r RelayRow
		if err := rows.Scan(&r.Name, &r.Host, &r.PID, &r.StartedAt, &r.SeenAt, &r.Since, &r.State, &r.Shards, &r.Ordered, &r.Published, &r.PublishedAt,
			&r.Failed, &r.LastError, &r.LastErrorAt, &r.Failing, &at); err != nil {
			return nil, time.Time{}, fmt.Errorf("outbox: list relays: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, time.Time{}, fmt.Errorf("outbox: list relays: %w", err)
	}
	if len(out) == 0 { // no row carried the time
		if err := q.QueryRow(ctx, `SELECT now()`).Scan(&at); err != nil {
			return nil, time.Time{}, fmt.Errorf("outbox: list relays: %w", err)
		}
	}
	return out, at, nil
}
