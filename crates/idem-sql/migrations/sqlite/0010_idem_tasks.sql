-- Tasks for polling agents, their timeline, and the pollers' cursors. A
-- task's id is derived from (namespace, tenant, queue, key); the key is the
-- observation's natural key. Every claim grows the fence; every write of a
-- worker is conditional on it. Leases are on the database's clock.
CREATE TABLE idem_tasks (
    id                  TEXT    PRIMARY KEY,
    tenant_id           TEXT    NOT NULL,
    queue               TEXT    NOT NULL,
    task_key            TEXT    NOT NULL,
    payload             TEXT    NOT NULL,
    payload_hash        TEXT    NOT NULL,
    state               TEXT    NOT NULL CHECK (state IN
                            ('ready', 'claimed', 'done', 'dead', 'needs_attention')),
    priority            INTEGER  NOT NULL,
    run_at_ms           INTEGER  NOT NULL,
    attempt             INTEGER  NOT NULL,
    max_attempts        INTEGER  NOT NULL,
    fence               INTEGER  NOT NULL,
    holder              TEXT,
    lease_expires_at_ms INTEGER,
    result              TEXT,
    result_hash         TEXT,
    last_error          TEXT,
    created_at_ms       INTEGER  NOT NULL,
    updated_at_ms       INTEGER  NOT NULL,
    finished_at_ms      INTEGER,
    -- How the latest claim took it: 'claimed' (ready), 'taken_over' (a
    -- lease that ended), 'dead' (a lease that ended on the last attempt).
    claim_kind          TEXT,
    UNIQUE (tenant_id, queue, task_key)
);
-- Claims take the ready tasks of a queue by priority and age, and the
-- claimed ones whose lease ended.
CREATE INDEX idem_tasks_ready ON idem_tasks (tenant_id, queue, priority DESC, run_at_ms)
    WHERE state = 'ready';
CREATE INDEX idem_tasks_leased ON idem_tasks (tenant_id, queue, lease_expires_at_ms)
    WHERE state = 'claimed';
CREATE INDEX idem_tasks_created ON idem_tasks (created_at_ms, id);
-- Retention: finished tasks are purged some time after they finished.
CREATE INDEX idem_tasks_finished ON idem_tasks (finished_at_ms) WHERE finished_at_ms IS NOT NULL;

CREATE TABLE idem_task_events (
    task_id  TEXT    NOT NULL REFERENCES idem_tasks (id) ON DELETE CASCADE,
    seq      INTEGER  NOT NULL,
    kind     TEXT    NOT NULL,
    actor    TEXT,
    fence    INTEGER,
    at_ms    INTEGER  NOT NULL,
    detail   TEXT,
    PRIMARY KEY (task_id, seq)
);

CREATE TABLE idem_pollers (
    tenant_id     TEXT    NOT NULL,
    poller        TEXT    NOT NULL,
    cursor        TEXT    NOT NULL,
    version       INTEGER  NOT NULL,
    updated_at_ms INTEGER  NOT NULL,
    PRIMARY KEY (tenant_id, poller)
);
