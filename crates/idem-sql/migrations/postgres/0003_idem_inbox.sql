CREATE TABLE idem_inbox (
    subscriber_id   TEXT   NOT NULL,
    message_id      TEXT   NOT NULL,
    processed_at_ms BIGINT NOT NULL,
    expires_at_ms   BIGINT NOT NULL,
    PRIMARY KEY (subscriber_id, message_id)
);
CREATE INDEX idem_inbox_expires_at ON idem_inbox (expires_at_ms);
