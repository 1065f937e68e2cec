CREATE TABLE idem_outbox (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id      TEXT    NOT NULL UNIQUE,
    topic           TEXT    NOT NULL,
    message_key     TEXT    NOT NULL,
    payload         BLOB    NOT NULL,
    headers         TEXT    NOT NULL,
    created_at_ms   INTEGER NOT NULL,
    available_at_ms INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    state           TEXT    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'dead')),
    locked_until_ms INTEGER,
    sent_at_ms      INTEGER
);
-- The claim scans pending messages in id order; sent ones kept for the
-- retention must not be in its way.
CREATE INDEX idem_outbox_pending ON idem_outbox (id) WHERE state = 'pending';
CREATE INDEX idem_outbox_pending_key ON idem_outbox (message_key, id) WHERE state = 'pending';
CREATE INDEX idem_outbox_sent ON idem_outbox (sent_at_ms) WHERE state = 'sent';
