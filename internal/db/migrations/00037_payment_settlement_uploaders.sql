-- internal/payments: a kept settlement file (00013) may be applied by every
-- operator who uploaded it, and so read its dry run, within the last hour.
-- payment_settlement_upload kept one uploader, and an upload of the same
-- bytes by a second operator (checking the same file) replaced the first:
-- the first was then refused at the confirmation, told that another
-- operator had uploaded the file (a drill). Each uploader now has a row
-- here with the time of their own latest upload, so each one's hour is
-- their own: a colleague uploading the same file later does not lengthen
-- it. Rows go with their file (ON DELETE CASCADE), so the pruning of
-- uploads past their hour takes their uploaders too, and a file uploaded
-- again after that starts with its new uploader alone.
--
-- payment_settlement_upload.uploaded_by stays, now the latest uploader:
-- it is NOT NULL, and a binary from before this migration still reads it
-- during a rolling upgrade. Existing uploads get their one uploader here,
-- at their time, so a dry run read before the upgrade can still be
-- confirmed by whoever uploaded it.

-- +goose Up
CREATE TABLE payment_settlement_uploader (
    sha256      text        NOT NULL REFERENCES payment_settlement_upload (sha256) ON DELETE CASCADE,
    uploaded_by text        NOT NULL,  -- iss|sub of the operator, never PII
    uploaded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sha256, uploaded_by)
);
INSERT INTO payment_settlement_uploader (sha256, uploaded_by, uploaded_at)
SELECT sha256, uploaded_by, uploaded_at FROM payment_settlement_upload;

-- +goose Down
-- Append-only history: the schema is never rolled back by this tool.
SELECT 1;
