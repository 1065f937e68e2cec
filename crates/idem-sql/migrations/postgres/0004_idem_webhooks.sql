CREATE TABLE idem_webhook_receipts (
    id              BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint        TEXT    NOT NULL,
    delivery_id     TEXT    NOT NULL,
    event_type      TEXT,
    headers         TEXT    NOT NULL,
    body            BYTEA   NOT NULL,
    entity_id       TEXT,
    entity_version  BIGINT,
    state           TEXT    NOT NULL DEFAULT 'received'
                            CHECK (state IN ('received', 'processed', 'failed', 'dead', 'stale')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    received_at_ms  BIGINT NOT NULL,
    available_at_ms BIGINT NOT NULL,
    locked_until_ms BIGINT,
    finished_at_ms  BIGINT,
    expires_at_ms   BIGINT NOT NULL,
    UNIQUE (endpoint, delivery_id)
);
CREATE INDEX idem_webhook_receipts_due ON idem_webhook_receipts (id)
    WHERE state IN ('received', 'failed');
CREATE INDEX idem_webhook_receipts_entity ON idem_webhook_receipts (endpoint, entity_id, id)
    WHERE state IN ('received', 'failed');
CREATE INDEX idem_webhook_receipts_expires ON idem_webhook_receipts (expires_at_ms);
-- The newest applied version per entity, for order awareness.
CREATE TABLE idem_webhook_entities (
    endpoint      TEXT    NOT NULL,
    entity_id     TEXT    NOT NULL,
    version       BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL,
    PRIMARY KEY (endpoint, entity_id)
);
CREATE INDEX idem_webhook_entities_expires ON idem_webhook_entities (expires_at_ms);
