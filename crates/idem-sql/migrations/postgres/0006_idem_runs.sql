-- Runs of multi-step operations, their steps, and the send-once ledger.
-- A run's id is derived from its key's scope; the key record carries its
-- final outcome.
CREATE TABLE idem_runs (
    id              TEXT    PRIMARY KEY,
    tenant_id       TEXT    NOT NULL,
    operation       TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    state           TEXT    NOT NULL CHECK (state IN
                        ('running', 'compensating', 'needs_attention', 'completed', 'failed')),
    input           BYTEA   NOT NULL,
    recovery_point  TEXT,
    failure         TEXT,
    blocked_step    TEXT,
    attention       TEXT,
    no_return       BOOLEAN NOT NULL DEFAULT FALSE,
    holder          TEXT,
    locked_until_ms BIGINT NOT NULL,
    fence           BIGINT NOT NULL,
    takeovers       BIGINT NOT NULL DEFAULT 0,
    deadline_ms     BIGINT NOT NULL,
    ttl_ms          BIGINT NOT NULL,
    created_at_ms   BIGINT NOT NULL,
    updated_at_ms   BIGINT NOT NULL,
    finished_at_ms  BIGINT,
    expires_at_ms   BIGINT
);
-- Recovery finds live runs whose lease ended, oldest due first.
CREATE INDEX idem_runs_due ON idem_runs (locked_until_ms)
    WHERE state IN ('running', 'compensating');
CREATE INDEX idem_runs_created ON idem_runs (created_at_ms);
CREATE INDEX idem_runs_expires ON idem_runs (expires_at_ms) WHERE expires_at_ms IS NOT NULL;
CREATE TABLE idem_run_steps (
    run_id         TEXT    NOT NULL REFERENCES idem_runs (id) ON DELETE CASCADE,
    name           TEXT    NOT NULL,
    seq            BIGINT NOT NULL,
    kind           TEXT    NOT NULL CHECK (kind IN
                       ('phase', 'call', 'send', 'at_most_once', 'undo', 'undo_phase')),
    state          TEXT    NOT NULL CHECK (state IN ('started', 'done', 'failed', 'not_sent')),
    attempts       INTEGER NOT NULL,
    step_key       TEXT    NOT NULL,
    fence          BIGINT NOT NULL,
    result         BYTEA,
    error          TEXT,
    started_at_ms  BIGINT,
    finished_at_ms BIGINT,
    updated_at_ms  BIGINT NOT NULL,
    PRIMARY KEY (run_id, name)
);
-- Message ids of effects on sinks without keys: one that is sent is never
-- sent again, by its run or any other, for as long as it is kept.
CREATE TABLE idem_send_once (
    message_id    TEXT    PRIMARY KEY,
    run_id        TEXT    NOT NULL,
    step          TEXT    NOT NULL,
    state         TEXT    NOT NULL CHECK (state IN ('sending', 'sent', 'not_sent')),
    attempts      INTEGER NOT NULL,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    sent_at_ms    BIGINT,
    expires_at_ms BIGINT NOT NULL
);
CREATE INDEX idem_send_once_expires ON idem_send_once (expires_at_ms);
