-- What the consumer of payment events does. Ledger entries have no unique
-- constraint on the message id on purpose: the inbox is what keeps a
-- redelivered event from writing a second one, and the drills count them.
CREATE TABLE demo_ledger_entries (
    tenant_id     TEXT   NOT NULL,
    payment_id    TEXT   NOT NULL,
    kind          TEXT   NOT NULL CHECK (kind IN ('charge', 'refund')),
    amount        BIGINT NOT NULL,
    message_id    TEXT   NOT NULL,
    stream_seq    BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL
);
CREATE INDEX demo_ledger_entries_payment ON demo_ledger_entries (tenant_id, payment_id);
-- One receipt per payment: "sent" once, recorded with a unique message id.
CREATE TABLE demo_notifications (
    message_id TEXT   NOT NULL PRIMARY KEY,
    tenant_id  TEXT   NOT NULL,
    payment_id TEXT   NOT NULL,
    kind       TEXT   NOT NULL,
    sent_at_ms BIGINT NOT NULL
);
CREATE INDEX demo_notifications_payment ON demo_notifications (tenant_id, payment_id);
