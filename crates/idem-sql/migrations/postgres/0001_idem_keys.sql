CREATE TABLE idem_keys (
    tenant_id        TEXT    NOT NULL,
    operation        TEXT    NOT NULL,
    idempotency_key  TEXT    NOT NULL,
    request_hash     BYTEA    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('pending', 'completed', 'failed')),
    status_code      INTEGER,
    response_headers TEXT,
    response_body    BYTEA,
    resource_type    TEXT,
    resource_id      TEXT,
    recovery_point   TEXT,
    locked_until_ms  BIGINT,
    lock_token       TEXT,
    created_at_ms    BIGINT NOT NULL,
    updated_at_ms    BIGINT NOT NULL,
    expires_at_ms    BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, operation, idempotency_key)
);
CREATE INDEX idem_keys_expires_at ON idem_keys (expires_at_ms);
