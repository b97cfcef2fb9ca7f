-- internal/audit: a row is appended at the place the sequence gave it.
--
-- The application's role may INSERT into audit_event, and so could choose
-- a row's seq. A row planted far ahead of the sequence (seq 10^12) would
-- stay the chain's head by seq while every real append after it took a
-- lower seq: `console audit verify` would then report the chain broken at
-- every later append, for good, and the tamper evidence would be useless
-- from that row on (a security review). The trigger refuses a seq the
-- sequence has not given yet (audit.Record and the column's default draw
-- it with nextval just before). A row slipped in below the head, or a
-- forged append at the head, is still possible with the role's
-- credentials: verify names the first, signed anchors (console audit
-- anchor) catch the second. A superuser can switch triggers off; verify
-- names what such a row breaks.

-- +goose Up
-- The function names the sequence by its oid, fixed here, never by a name
-- looked up when a row is inserted: a name would follow the inserting
-- session's search_path, where a temporary table of the same name (any role
-- may create one) comes first, with a sequence the session may set (a
-- review planted a row at 10^12 that way). Its own search_path keeps pg_temp
-- last, and the oid saves the lookup on every row.
-- +goose StatementBegin
DO $do$
BEGIN
    EXECUTE format($f$
        CREATE FUNCTION audit_event_in_place() RETURNS trigger LANGUAGE plpgsql
        SET search_path = pg_catalog, pg_temp AS $body$
        BEGIN
            IF NEW.seq > coalesce(pg_sequence_last_value(%s::oid::regclass), 0) THEN
                RAISE EXCEPTION 'audit_event: seq %% is ahead of the sequence: rows are appended at the place nextval gives them', NEW.seq
                    USING ERRCODE = 'insufficient_privilege';
            END IF;
            RETURN NEW;
        END
        $body$$f$, pg_get_serial_sequence('audit_event', 'seq')::regclass::oid);
END
$do$;
-- +goose StatementEnd
CREATE TRIGGER audit_event_in_place BEFORE INSERT ON audit_event
    FOR EACH ROW EXECUTE FUNCTION audit_event_in_place();

-- +goose Down
DROP TRIGGER audit_event_in_place ON audit_event;
DROP FUNCTION audit_event_in_place();
