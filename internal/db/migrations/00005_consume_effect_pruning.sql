-- internal/inbox: the reference consumer's effect table is pruned with the
-- inbox (same retention), oldest first, so it stays bounded like every other
-- table the product writes.

-- +goose Up
CREATE INDEX consume_effect_applied_idx ON consume_effect (applied_at);

-- +goose Down
DROP INDEX consume_effect_applied_idx;
