-- internal/payments: a statement that writes several tables at once (the
-- reserve and the settlement of a payment, each one statement and one round
-- trip: bench/README.md, P1) must write all of its rows or none. Its data-
-- modifying WITH items chain on each other's RETURNING rows, and what cannot
-- be expressed that way is checked by its final SELECT with sluice_assert:
-- an error, so the statement's implicit transaction rolls back whole.
-- SQLSTATE SL001 tells the caller it was this check, not a constraint.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION sluice_assert(ok boolean, what text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION 'sluice: statement invariant broken: %', what USING ERRCODE = 'SL001';
    END IF;
    RETURN true;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The schema is never rolled back by this tool.
SELECT 1;
