-- The relays' claims take turns (outbox.Relay, claimTurnSQL): each claim
-- transaction locks this table in EXCLUSIVE mode before it reads, and holds
-- the lock until it commits. Until now the turn was a transaction-level
-- advisory lock, taken by a SELECT: a relay waiting for its turn kept that
-- SELECT's snapshot, and the row versions its own previous claim had
-- replaced could not be pruned until the wait ended, so its marks wrote each
-- new version in full on another page (bench R1: about 1 KB more WAL per
-- event). LOCK TABLE waits without a snapshot.
--
-- The table holds no rows and nothing else reads or writes it; ACCESS SHARE
-- (a SELECT, pg_dump) does not conflict with EXCLUSIVE, so only claims wait
-- for claims.

-- +goose Up
CREATE TABLE outbox_claim_turn ();

-- +goose Down
-- The schema is never rolled back by this tool.
SELECT 1;
