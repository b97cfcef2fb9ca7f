-- internal/outbox: leave half of every page free, so the relay's claim (and
-- a released attempt) is a HOT update. The claim changes only columns no
-- index reads (locked_until, lock_token, attempts), but with full pages the
-- new row version had to go to another page, which costs a new entry in each
-- of the table's six indexes and about 2 KB of WAL per event. With room on
-- the page the claim writes the new version beside the old one and no index
-- at all: R1 in bench/README.md measured 5.2 KB → 3.0 KB of WAL per event.
-- Half, because an event row with a typical ~1 KB payload then leaves room on
-- its page for one new version of each row the page holds. The price is disk:
-- pages of the outbox table hold half as many rows until the pruner removes
-- published history. Only new pages follow the setting; nothing is rewritten,
-- and the lock it takes does not block reads or writes.
-- internal/outbox/plan_internal_test.go (TestClaimIsAHOTUpdate) keeps it so.

-- +goose Up
ALTER TABLE outbox_event SET (fillfactor = 50);

-- +goose Down
ALTER TABLE outbox_event RESET (fillfactor);
