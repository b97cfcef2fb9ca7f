-- internal/inbox: the last pruning pass, so the console's inbox page can say
-- when the inbox was last pruned and with which retention (the console is
-- not told INBOX_RETENTION; the pass that used it records it). One row,
-- replaced by each pass: the table never grows.

-- +goose Up
CREATE TABLE inbox_prune_run (
    only_row   boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    pruned_at  timestamptz NOT NULL,
    retention  interval    NOT NULL,
    deleted    bigint      NOT NULL CHECK (deleted >= 0)
);

-- +goose Down
DROP TABLE inbox_prune_run;
