-- What operators did through the admin API: one row per action, written in
-- the transaction of the action's own idempotency key record, so a replayed
-- request never writes a second row.
CREATE TABLE idem_admin_audit (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms           INTEGER NOT NULL,
    actor           TEXT    NOT NULL,
    action          TEXT    NOT NULL,
    target          TEXT    NOT NULL,
    detail          TEXT    NOT NULL,
    idempotency_key TEXT
);
CREATE INDEX idem_admin_audit_action ON idem_admin_audit (action, id);
-- Admin listings: outbox messages by state, inbox records newest first.
CREATE INDEX idem_outbox_state ON idem_outbox (state, id);
CREATE INDEX idem_inbox_processed ON idem_inbox (processed_at_ms, subscriber_id, message_id);
