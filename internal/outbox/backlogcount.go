package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/db"
)

// The backlog counts (migration 00021): outbox_backlog_count holds
// insert-only delta rows, +k or -k events of a topic in status pending or
// dead, and a count is the sum of its rows. INSERT, DELETE and TRUNCATE on
// outbox_event keep them by trigger, whoever runs them. An UPDATE that changes
// a status writes its own delta in the same statement (countedUpdate): an
// UPDATE trigger would cost every claim the old and new versions of its rows
// (bench/README.md, "The dashboard snapshot"). So nothing outside this
// package may change outbox_event.status (nor topic, which nothing
// changes); whoever does by hand runs RecountBacklog (`console outbox
// recount`) after.

// backlogCountLock is the advisory lock that orders RecountBacklog (and the
// TRUNCATE trigger, which names the same number) and compactions: each takes
// it exclusively, the recount and the trigger waiting for it, a compaction
// skipping its turn when it is taken.
const backlogCountLock int64 = 0x511CEB0C07

// countedUpdate wraps update, an UPDATE of outbox_event whose WHERE clause
// admits only rows whose status is from (an SQL expression: a literal or a
// parameter), into a statement that also writes the backlog delta of the
// rows it changed: -1 for from and +1 for the new status, per topic, for
// the counted statuses (pending, dead). update must RETURN its rows' topic AS
// delta_topic and status AS delta_status first; the statement returns
// columns (over the update's RETURNING list, named u.…) for each changed row.
// One statement: the delta commits if and only if the change does.
func countedUpdate(from, update, columns string) string {
	return `WITH u AS (` + update + `),
	delta AS (
		INSERT INTO outbox_backlog_count (topic, status, n)
		SELECT topic, status, sum(d) FROM (
			SELECT delta_topic AS topic, delta_status AS status, 1 AS d FROM u
			UNION ALL
			SELECT delta_topic, ` + from + `, -1 FROM u
		) x
		 WHERE status IN ('pending', 'dead')
		 GROUP BY topic, status
		HAVING sum(d) <> 0)
	SELECT ` + columns + ` FROM u`
}

// CompactBacklogCounts collapses the delta rows into one per (topic,
// status), none for a zero count, and returns how many rows it removed. The
// relays call it at most once a second after publishing, the console every
// few seconds; calling it more often only costs time.
//
// It is one statement, safe under concurrent writers: the DELETE removes,
// and RETURNs, the rows of its snapshot, and the INSERT adds their sum, in
// the same transaction, so the total of every (topic, status) is unchanged at
// every commit. Rows writers add meanwhile are not in its snapshot: they stay
// as they are, for the next compaction.
//
// It takes backlogCountLock exclusively, without waiting: while a recount,
// a TRUNCATE of outbox_event or another compaction holds it, this call does
// nothing and waits for nothing. The lock is taken in the statement's first
// step, before any row is deleted (the DELETE's condition reads it), and held
// until commit, so a recount's snapshot, taken after it got the lock, sees
// either none or all of this compaction. Until 6 December compactions took it
// shared and ran together, each deleting the whole table: the second waited
// on the first's deleted rows, and once the table outgrew a quarter of
// shared_buffers (autovacuum behind; PostgreSQL then starts a second
// sequential scan where the first one is) two relays' compactions deadlocked,
// stalling both relays' loops for deadlock_timeout (bench R2 in the full mode:
// six deadlocks in seven minutes, p99 782 ms at 1,000 events/s).
// The statement rewrites nothing when every (topic, status) already has one
// row, so an idle system writes nothing.
func CompactBacklogCounts(ctx context.Context, q db.RowQuerier) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, `
		WITH may AS (
			SELECT pg_try_advisory_xact_lock($1)
			   AND (SELECT count(*) > count(DISTINCT (topic, status)) FROM outbox_backlog_count) AS ok
		), gone AS (
			DELETE FROM outbox_backlog_count WHERE (SELECT ok FROM may) RETURNING topic, status, n
		), kept AS (
			INSERT INTO outbox_backlog_count (topic, status, n)
			SELECT topic, status, sum(n) FROM gone GROUP BY topic, status HAVING sum(n) <> 0
			RETURNING 1
		)
		SELECT (SELECT count(*) FROM gone) - (SELECT count(*) FROM kept)`, backlogCountLock).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("outbox: compact backlog counts: %w", err)
	}
	return n, nil
}

// RecountBacklog replaces the delta rows with an exact count of the pending
// and dead events per topic (through their partial indexes: O(pending +
// dead)), for repair after someone changed outbox_event.status by hand or
// wrote with the triggers disabled (the bench's bulk preloads). It returns
// the pending and dead totals.
//
// One transaction: it locks outbox_event ACCESS SHARE first (so it queues
// behind a TRUNCATE rather than holding the advisory lock the TRUNCATE
// trigger waits for), then takes backlogCountLock exclusively, which waits
// for running compactions to commit and keeps new ones out. Then one
// statement deletes the deltas and counts the events on one snapshot:
// every delta visible there belongs to a change visible there (a delta
// commits with its change), and a writer that commits later leaves its
// delta rows, which this statement does not see, to add to the recount.
func RecountBacklog(ctx context.Context, pool db.Beginner) (pending, dead int64, err error) {
	err = db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `LOCK TABLE outbox_event IN ACCESS SHARE MODE`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, backlogCountLock); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `
			WITH gone AS (DELETE FROM outbox_backlog_count),
			counted AS (
				SELECT topic, 'pending' AS status, count(*) AS n
				  FROM outbox_event WHERE status = 'pending' AND topic > '' GROUP BY topic
				UNION ALL
				SELECT topic, 'dead', count(*) FROM outbox_event WHERE status = 'dead' GROUP BY topic
			), kept AS (
				INSERT INTO outbox_backlog_count (topic, status, n) SELECT topic, status, n FROM counted
			)
			SELECT coalesce(sum(n) FILTER (WHERE status = 'pending'), 0),
			       coalesce(sum(n) FILTER (WHERE status = 'dead'), 0)
			  FROM counted`).Scan(&pending, &dead)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("outbox: recount backlog: %w", err)
	}
	return pending, dead, nil
}
