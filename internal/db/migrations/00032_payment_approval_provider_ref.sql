-- internal/payments: a four-eyes request can come from a settlement file
-- uploaded in the console (a line that would resolve a payment above
-- CONSOLE_FOUR_EYES_ABOVE waits for a second operator, as a typed
-- resolution does). The line's provider reference travels with the
-- request, so the approval records it on the payment as the file would.

-- +goose Up
ALTER TABLE payment_approval ADD COLUMN provider_ref text NOT NULL DEFAULT '';

-- +goose Down
-- Append-only history: the schema is never rolled back by this tool.
SELECT 1;
