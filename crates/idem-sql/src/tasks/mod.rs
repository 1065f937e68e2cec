//! Tasks, their timeline and the pollers' cursors: the statements both
//! backends run, and [`TaskStore`](idem_core::tasks::TaskStore)'s methods,
//! written once ([`store`]).
//!
//! Every write of a worker locks the task's row first (`FOR UPDATE` on
//! PostgreSQL; SQLite's transactions hold the write lock from `BEGIN`),
//! decides with [`idem_core::tasks::plan_settle`] on the row as it stands,
//! and writes conditional on the fence. Actions use the steps' send-once
//! ledger (`idem_send_once`) through its own claim statement: the entry's
//! `run_id` names the claim and the ask told go
//! ([`AskHolder`](idem_core::tasks::AskHolder): `<task>@<fence>#…`), so the
//! exact replay of that ask is told go again and any other ask — of this
//! claim or another — meets an unknown outcome.

use std::sync::LazyLock;

/// The columns of `idem_tasks`, in the order the decoder reads them.
pub const TASK_COLUMNS: &str = "id, tenant_id, queue, task_key, payload, payload_hash, state, \
    priority, run_at_ms, attempt, max_attempts, fence, holder, lease_expires_at_ms, result, \
    result_hash, last_error, created_at_ms, updated_at_ms, finished_at_ms, claim_kind";

/// A new task, unless its key (or id) was seen: `$1` id, `$2` tenant, `$3`
/// queue, `$4` key, `$5` payload, `$6` its hash, `$7` priority, `$8` run at,
/// `$9` max attempts, `$10` now.
pub static INSERT_TASK: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO idem_tasks (id, tenant_id, queue, task_key, payload, payload_hash, state, \
         priority, run_at_ms, attempt, max_attempts, fence, created_at_ms, updated_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, 'ready', $7, $8, 0, $9, 0, $10, $10) \
         ON CONFLICT DO NOTHING RETURNING {TASK_COLUMNS}"
    )
});

/// The task keyed `$3` in queue `$2` of tenant `$1`.
pub static TASK_BY_KEY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {TASK_COLUMNS} FROM idem_tasks \
         WHERE tenant_id = $1 AND queue = $2 AND task_key = $3"
    )
});

/// Task `$1`.
pub static TASK: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {TASK_COLUMNS} FROM idem_tasks WHERE id = $1"));

/// A timeline entry, numbered after the task's last: `$1` task, `$2` kind,
/// `$3` actor, `$4` fence, `$5` at, `$6` detail. The task's row is locked
/// by the write it records, so its entries are numbered one at a time.
pub const INSERT_EVENT: &str = "INSERT INTO idem_task_events \
    (task_id, seq, kind, actor, fence, at_ms, detail) \
    SELECT $1, COALESCE(MAX(seq), 0) + 1, $2, $3, $4, $5, $6 \
    FROM idem_task_events WHERE task_id = $1";

/// A task's timeline, oldest first.
pub const EVENTS: &str = "SELECT seq, kind, actor, fence, at_ms, detail FROM idem_task_events \
    WHERE task_id = $1 ORDER BY seq LIMIT 1000";

macro_rules! fenced_update {
    ($set:literal) => {
        LazyLock::new(|| {
            format!(
                "UPDATE idem_tasks SET {} WHERE id = $1 AND fence = $2 RETURNING {TASK_COLUMNS}",
                $set
            )
        })
    };
}

/// The holder renews: `$3` the lease's end, `$4` now.
pub static RENEW: LazyLock<String> = fenced_update!("lease_expires_at_ms = $3, updated_at_ms = $4");

/// The holder completes: `$3` result, `$4` its hash, `$5` now.
pub static COMPLETE: LazyLock<String> = fenced_update!(
    "state = 'done', result = $3, result_hash = $4, holder = NULL, \
     lease_expires_at_ms = NULL, finished_at_ms = $5, updated_at_ms = $5"
);

/// The holder fails, attempts remain: `$3` when it may run again, `$4`
/// the error, `$5` now.
pub static RETRY: LazyLock<String> = fenced_update!(
    "state = 'ready', run_at_ms = $3, last_error = $4, holder = NULL, \
     lease_expires_at_ms = NULL, updated_at_ms = $5"
);

/// The holder fails on the last attempt: `$3` the error, `$4` now.
pub static DEAD: LazyLock<String> = fenced_update!(
    "state = 'dead', last_error = $3, holder = NULL, lease_expires_at_ms = NULL, \
     finished_at_ms = $4, updated_at_ms = $4"
);

/// An action's outcome is unknown and may not be retried: `$3` now.
pub static ATTENTION: LazyLock<String> = fenced_update!(
    "state = 'needs_attention', holder = NULL, lease_expires_at_ms = NULL, updated_at_ms = $3"
);

/// An operator makes the task ready again now, with one more attempt
/// allowed, its fence grown: `$1` task, `$2` now.
pub static REVIVE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE idem_tasks SET state = 'ready', run_at_ms = $2, \
         max_attempts = CASE WHEN max_attempts > attempt THEN max_attempts ELSE attempt + 1 END, \
         holder = NULL, lease_expires_at_ms = NULL, finished_at_ms = NULL, fence = fence + 1, \
         updated_at_ms = $2 WHERE id = $1 RETURNING {TASK_COLUMNS}"
    )
});

/// A poller's first cursor: `$1` tenant, `$2` poller, `$3` cursor, `$4` now.
pub const INSERT_CURSOR: &str = "INSERT INTO idem_pollers \
    (tenant_id, poller, cursor, version, updated_at_ms) VALUES ($1, $2, $3, 1, $4) \
    ON CONFLICT DO NOTHING";

/// A cursor moved from `$3` to `$4` at `$5`, only if it is at `$3`.
pub const MOVE_CURSOR: &str = "UPDATE idem_pollers \
    SET cursor = $4, version = version + 1, updated_at_ms = $5 \
    WHERE tenant_id = $1 AND poller = $2 AND cursor = $3";

/// A poller's cursor.
pub const CURSOR: &str = "SELECT tenant_id, poller, cursor, version, updated_at_ms \
    FROM idem_pollers WHERE tenant_id = $1 AND poller = $2";

/// An action's ledger entry marked sent: `$1` key, `$2` now.
/// Whatever its state: a worker (or an operator) saying it happened is
/// the last word, even after a `not-sent` freed it — else the next ask
/// would be told go.
pub const MARK_SENT: &str = "UPDATE idem_send_once \
    SET state = 'sent', sent_at_ms = COALESCE(sent_at_ms, $2), updated_at_ms = $2 \
    WHERE message_id = $1";

/// An action's ledger entry freed for another attempt: `$1` key, `$2` now.
pub const MARK_NOT_SENT: &str = "UPDATE idem_send_once \
    SET state = 'not_sent', updated_at_ms = $2 WHERE message_id = $1 AND state = 'sending'";

/// Whether queue `$2` of tenant `$1` has a task a claim at `$3` would take.
pub const HAS_DUE: &str = "SELECT EXISTS (SELECT 1 FROM idem_tasks \
    WHERE tenant_id = $1 AND queue = $2 \
      AND ((state = 'ready' AND run_at_ms <= $3) \
           OR (state = 'claimed' AND lease_expires_at_ms <= $3)))";

/// Whether claim `$2` of task `$1` was told the outcome of an earlier
/// attempt is unknown and asked to verify it (`$3`: the `action` event's
/// detail, `verify <action>: unknown`).
pub const ASKED_TO_VERIFY: &str = "SELECT EXISTS (SELECT 1 FROM idem_task_events \
    WHERE task_id = $1 AND fence = $2 AND kind = 'action' AND detail = $3)";

/// How many tasks each queue holds in each state.
pub const COUNT: &str = "SELECT queue, state, count(*) AS n FROM idem_tasks GROUP BY queue, state";

/// The claim of a queue's due tasks: `$1` tenant, `$2` queue, `$3` worker,
/// `$4` now, `$5` lease, `$6` limit. A task whose lease ended on its last
/// attempt is dead instead (`claim_kind` says which).
macro_rules! claim_tasks {
    ($lock:literal) => {
        LazyLock::new(|| {
            format!(
                "UPDATE idem_tasks SET
    claim_kind = CASE WHEN state = 'claimed' AND attempt >= max_attempts THEN 'dead'
                      WHEN state = 'claimed' THEN 'taken_over' ELSE 'claimed' END,
    state = CASE WHEN state = 'claimed' AND attempt >= max_attempts THEN 'dead'
                 ELSE 'claimed' END,
    last_error = CASE WHEN state = 'claimed' AND attempt >= max_attempts
                      THEN 'the lease of the last attempt ended' ELSE last_error END,
    finished_at_ms = CASE WHEN state = 'claimed' AND attempt >= max_attempts THEN $4
                          ELSE finished_at_ms END,
    holder = CASE WHEN state = 'claimed' AND attempt >= max_attempts THEN NULL ELSE $3 END,
    lease_expires_at_ms = CASE WHEN state = 'claimed' AND attempt >= max_attempts THEN NULL
                               ELSE $4 + $5 END,
    attempt = CASE WHEN state = 'claimed' AND attempt >= max_attempts THEN attempt
                   ELSE attempt + 1 END,
    fence = fence + 1,
    updated_at_ms = $4
WHERE id IN (
    SELECT id FROM idem_tasks
    WHERE tenant_id = $1 AND queue = $2
      AND ((state = 'ready' AND run_at_ms <= $4)
           OR (state = 'claimed' AND lease_expires_at_ms <= $4))
    ORDER BY priority DESC, run_at_ms, id
    LIMIT $6 {})
RETURNING {TASK_COLUMNS}",
                $lock
            )
        })
    };
}

/// SQLite's texts: its transactions hold the write lock from `BEGIN`.
pub mod sqlite {
    use super::*;

    /// Task `$1`, for a write.
    pub static LOCK_TASK: LazyLock<String> = LazyLock::new(|| TASK.clone());

    /// The claim (`claim_tasks!`).
    pub static CLAIM: LazyLock<String> = claim_tasks!("");

    /// Tasks newest first: `$1` queue or NULL, `$2` state or NULL, `$3`/`$4`
    /// the cursor (created, id) or NULL, `$5` limit.
    pub static LIST: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {TASK_COLUMNS} FROM idem_tasks \
             WHERE ($1 IS NULL OR queue = $1) AND ($2 IS NULL OR state = $2) \
               AND ($3 IS NULL OR (created_at_ms, id) < ($3, $4)) \
             ORDER BY created_at_ms DESC, id DESC LIMIT $5"
        )
    });

    /// What the shared code reads.
    pub const TEXTS: Texts = Texts {
        lock_task: &LOCK_TASK,
        claim: &CLAIM,
        list: &LIST,
    };
}

/// PostgreSQL's texts: rows locked for a write, claimers skip each other's.
pub mod postgres {
    use super::*;

    /// Task `$1`, locked for a write.
    pub static LOCK_TASK: LazyLock<String> = LazyLock::new(|| format!("{} FOR UPDATE", *TASK));

    /// The claim (`claim_tasks!`), skipping rows another claimer holds.
    pub static CLAIM: LazyLock<String> = claim_tasks!("FOR UPDATE SKIP LOCKED");

    /// Tasks newest first (as SQLite's `LIST`, with typed NULLs).
    pub static LIST: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {TASK_COLUMNS} FROM idem_tasks \
             WHERE ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR state = $2) \
               AND ($3::bigint IS NULL OR (created_at_ms, id) < ($3, $4::text)) \
             ORDER BY created_at_ms DESC, id DESC LIMIT $5"
        )
    });

    /// What the shared code reads.
    pub const TEXTS: Texts = Texts {
        lock_task: &LOCK_TASK,
        claim: &CLAIM,
        list: &LIST,
    };
}

/// One dialect's task texts.
#[derive(Debug)]
pub struct Texts {
    /// Task `$1`, for a write.
    pub lock_task: &'static LazyLock<String>,
    /// The claim.
    pub claim: &'static LazyLock<String>,
    /// Tasks newest first.
    pub list: &'static LazyLock<String>,
}

/// This capability's text in `D`'s SQL family.
pub(crate) fn texts<D: crate::Dialect>() -> &'static Texts {
    D::FAMILY.pick(&sqlite::TEXTS, &postgres::TEXTS)
}

pub mod store;
