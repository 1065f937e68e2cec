//! Tasks, their timeline and the pollers' cursors: the statements both
//! backends run, and [`task_store!`](crate::task_store), which implements
//! [`TaskStore`](idem_core::tasks::TaskStore) for a backend's store.
//!
//! Every write of a worker locks the task's row first (`FOR UPDATE` on
//! PostgreSQL; SQLite's transactions hold the write lock from `BEGIN`),
//! decides with [`idem_core::tasks::plan_settle`] on the row as it stands,
//! and writes conditional on the fence. Actions use the steps' send-once
//! ledger (`idem_send_once`) through its own claim statement: the entry's
//! `run_id` is `<task>@<fence>`, so a retried request of one claim is
//! claimed again and another claim's unfinished attempt is an unknown
//! outcome.

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
pub const MARK_SENT: &str = "UPDATE idem_send_once \
    SET state = 'sent', sent_at_ms = COALESCE(sent_at_ms, $2), updated_at_ms = $2 \
    WHERE message_id = $1 AND state IN ('sending', 'sent')";

/// An action's ledger entry freed for another attempt: `$1` key, `$2` now.
pub const MARK_NOT_SENT: &str = "UPDATE idem_send_once \
    SET state = 'not_sent', updated_at_ms = $2 WHERE message_id = $1 AND state = 'sending'";

/// Whether queue `$2` of tenant `$1` has a task a claim at `$3` would take.
pub const HAS_DUE: &str = "SELECT EXISTS (SELECT 1 FROM idem_tasks \
    WHERE tenant_id = $1 AND queue = $2 \
      AND ((state = 'ready' AND run_at_ms <= $3) \
           OR (state = 'claimed' AND lease_expires_at_ms <= $3)))";

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

    /// The claim ([`claim_tasks!`]).
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
}

/// PostgreSQL's texts: rows locked for a write, claimers skip each other's.
pub mod postgres {
    use super::*;

    /// Task `$1`, locked for a write.
    pub static LOCK_TASK: LazyLock<String> = LazyLock::new(|| format!("{} FOR UPDATE", *TASK));

    /// The claim ([`claim_tasks!`]), skipping rows another claimer holds.
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
}

/// Implements [`TaskStore`](idem_core::tasks::TaskStore) for a backend's
/// store: `task_store!(Store, Tx, sqlite)` (or `postgres`), the dialect's
/// module of this file and of [`crate::runs`] named last.
#[macro_export]
macro_rules! task_store {
    ($store:ty, $tx:ty, $d:ident) => {
        const _: () = {
            use idem_core::StoreError;
            use idem_core::steps::MessageState;
            use idem_core::tasks::{
                ActionAttempt, ActionClaim, ActionDecision, ActionMode, ActionOutcome,
                ClaimRequest, CursorMove, Fenced, NewTask, PollerRecord, Settle, SettlePlan,
                SettleWrite, Steer, Steered, TaskEvent, TaskFilter, TaskRecord, TaskState,
                TaskStore, holds, plan_settle,
            };
            use $crate::decode;
            use $crate::tasks as sql;

            /// One timeline entry.
            async fn event(
                tx: &mut $tx,
                task: &str,
                kind: &str,
                actor: Option<&str>,
                fence: Option<i64>,
                at_ms: i64,
                detail: Option<&str>,
            ) -> Result<(), StoreError> {
                sqlx::query(sql::INSERT_EVENT)
                    .bind(task)
                    .bind(kind)
                    .bind(actor)
                    .bind(fence)
                    .bind(at_ms)
                    .bind(detail)
                    .execute(&mut **tx)
                    .await
                    .map(drop)
                    .map_err(map_err)
            }

            /// The task of `tenant`, locked for a write (another tenant's is
            /// none of the caller's business: missing).
            async fn locked(
                tx: &mut $tx,
                tenant: &str,
                task: &str,
            ) -> Result<Option<TaskRecord>, StoreError> {
                let row = sqlx::query(&sql::$d::LOCK_TASK)
                    .bind(task)
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(map_err)?;
                let t = row.as_ref().map(decode::task).transpose()?;
                Ok(t.filter(|t| t.tenant == tenant))
            }

            /// The holder of `fence` settles `task` as `w` says.
            async fn write(
                tx: &mut $tx,
                t: &TaskRecord,
                fence: i64,
                settle: &Settle<'_>,
                w: SettleWrite,
                now_ms: i64,
            ) -> Result<TaskRecord, StoreError> {
                let q = match (&w, settle) {
                    (SettleWrite::Renew { until_ms }, _) => sqlx::query(&sql::RENEW)
                        .bind(&t.id)
                        .bind(fence)
                        .bind(*until_ms)
                        .bind(now_ms),
                    (
                        SettleWrite::Complete,
                        Settle::Complete {
                            result,
                            result_hash,
                        },
                    ) => sqlx::query(&sql::COMPLETE)
                        .bind(&t.id)
                        .bind(fence)
                        .bind(*result)
                        .bind(*result_hash)
                        .bind(now_ms),
                    (SettleWrite::Retry { run_at_ms }, Settle::Fail { error, .. }) => {
                        sqlx::query(&sql::RETRY)
                            .bind(&t.id)
                            .bind(fence)
                            .bind(*run_at_ms)
                            .bind(*error)
                            .bind(now_ms)
                    }
                    (SettleWrite::Dead, Settle::Fail { error, .. }) => sqlx::query(&sql::DEAD)
                        .bind(&t.id)
                        .bind(fence)
                        .bind(*error)
                        .bind(now_ms),
                    _ => {
                        return Err(StoreError::Corrupt {
                            detail: format!("a settle planned as {w:?}"),
                        });
                    }
                };
                let row = q.fetch_one(&mut **tx).await.map_err(map_err)?;
                let written = decode::task(&row)?;
                let (kind, detail) = match (&w, settle) {
                    (SettleWrite::Renew { .. }, _) => return Ok(written),
                    (SettleWrite::Complete, _) => ("completed", None),
                    (SettleWrite::Retry { .. }, Settle::Fail { error, .. }) => {
                        ("failed", Some(*error))
                    }
                    (_, Settle::Fail { error, .. }) => ("dead", Some(*error)),
                    _ => ("dead", None),
                };
                event(
                    tx,
                    &t.id,
                    kind,
                    t.holder.as_deref(),
                    Some(fence),
                    now_ms,
                    detail,
                )
                .await?;
                Ok(written)
            }

            impl TaskStore for $store {
                async fn create_task(
                    tx: &mut $tx,
                    task: &NewTask<'_>,
                ) -> Result<(TaskRecord, bool), StoreError> {
                    let row = sqlx::query(&sql::INSERT_TASK)
                        .bind(task.id)
                        .bind(task.tenant)
                        .bind(task.queue)
                        .bind(task.key)
                        .bind(task.payload)
                        .bind(task.payload_hash)
                        .bind(task.priority)
                        .bind(task.run_at_ms)
                        .bind(i64::from(task.max_attempts))
                        .bind(task.now_ms)
                        .fetch_optional(&mut **tx)
                        .await
                        .map_err(map_err)?;
                    if let Some(row) = row {
                        let created = decode::task(&row)?;
                        event(tx, task.id, "created", None, None, task.now_ms, None).await?;
                        return Ok((created, true));
                    }
                    let row = sqlx::query(&sql::TASK_BY_KEY)
                        .bind(task.tenant)
                        .bind(task.queue)
                        .bind(task.key)
                        .fetch_optional(&mut **tx)
                        .await
                        .map_err(map_err)?;
                    match row {
                        Some(row) => Ok((decode::task(&row)?, false)),
                        // The id is taken by another key: not a derived id.
                        None => Err(StoreError::Corrupt {
                            detail: format!("task id {} is another key's", task.id),
                        }),
                    }
                }

                async fn move_cursor(
                    tx: &mut $tx,
                    tenant: &str,
                    poller: &str,
                    expected: Option<&str>,
                    value: &str,
                    now_ms: i64,
                ) -> Result<CursorMove, StoreError> {
                    let moved = match expected {
                        None => {
                            sqlx::query(sql::INSERT_CURSOR)
                                .bind(tenant)
                                .bind(poller)
                                .bind(value)
                                .bind(now_ms)
                                .execute(&mut **tx)
                                .await
                        }
                        Some(from) => {
                            sqlx::query(sql::MOVE_CURSOR)
                                .bind(tenant)
                                .bind(poller)
                                .bind(from)
                                .bind(value)
                                .bind(now_ms)
                                .execute(&mut **tx)
                                .await
                        }
                    }
                    .map_err(map_err)?;
                    if moved.rows_affected() == 1 {
                        return Ok(CursorMove::Moved);
                    }
                    let current: Option<String> = sqlx::query_scalar(
                        "SELECT cursor FROM idem_pollers WHERE tenant_id = $1 AND poller = $2",
                    )
                    .bind(tenant)
                    .bind(poller)
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(map_err)?;
                    Ok(match current {
                        Some(c) if c == value => CursorMove::AlreadyThere,
                        other => CursorMove::Conflict(other),
                    })
                }

                async fn cursor(
                    &self,
                    tenant: &str,
                    poller: &str,
                ) -> Result<Option<PollerRecord>, StoreError> {
                    self.bounded(async {
                        let row = sqlx::query(sql::CURSOR)
                            .bind(tenant)
                            .bind(poller)
                            .fetch_optional(self.pool())
                            .await
                            .map_err(|e| self.map(e))?;
                        row.as_ref().map(decode::poller).transpose()
                    })
                    .await
                }

                async fn claim_tasks(
                    tx: &mut $tx,
                    claim: &ClaimRequest<'_>,
                ) -> Result<Vec<TaskRecord>, StoreError> {
                    // Tasks that died (their last lease ended) are not
                    // claimed: look again for as many, until none died.
                    let mut claimed = Vec::new();
                    loop {
                        let want = i64::from(claim.max) - claimed.len() as i64;
                        let rows = sqlx::query(&sql::$d::CLAIM)
                            .bind(claim.tenant)
                            .bind(claim.queue)
                            .bind(claim.worker)
                            .bind(claim.now_ms)
                            .bind(claim.lease_ms)
                            .bind(want)
                            .fetch_all(&mut **tx)
                            .await
                            .map_err(map_err)?;
                        let before = claimed.len();
                        for row in &rows {
                            let t = decode::task(row)?;
                            let kind = t.claim_kind.clone().unwrap_or_default();
                            let actor = (t.state == TaskState::Claimed).then_some(claim.worker);
                            event(tx, &t.id, &kind, actor, Some(t.fence), claim.now_ms, None)
                                .await?;
                            if t.state == TaskState::Claimed {
                                claimed.push(t);
                            }
                        }
                        let died = rows.len() - (claimed.len() - before);
                        if died == 0 || (rows.len() as i64) < want {
                            return Ok(claimed);
                        }
                    }
                }

                async fn settle(
                    tx: &mut $tx,
                    tenant: &str,
                    task: &str,
                    fence: i64,
                    settle: &Settle<'_>,
                    now_ms: i64,
                ) -> Result<Fenced, StoreError> {
                    let Some(t) = locked(tx, tenant, task).await? else {
                        return Ok(Fenced::Missing);
                    };
                    match plan_settle(&t, fence, settle, now_ms) {
                        SettlePlan::Refuse(r) => Ok(r.with(t)),
                        SettlePlan::Write(w) => Ok(Fenced::Written(
                            write(tx, &t, fence, settle, w, now_ms).await?,
                        )),
                    }
                }

                async fn claim_action(
                    tx: &mut $tx,
                    a: &ActionAttempt<'_>,
                ) -> Result<ActionClaim, StoreError> {
                    let Some(t) = locked(tx, a.tenant, a.task).await? else {
                        return Ok(ActionClaim::Missing);
                    };
                    if !holds(&t, a.fence, a.now_ms) {
                        return Ok(ActionClaim::LeaseLost(t));
                    }
                    let attempt = format!("{}@{}", a.task, a.fence);
                    let row = sqlx::query($crate::runs::$d::CLAIM_MESSAGE)
                        .bind(a.key)
                        .bind(&attempt)
                        .bind(a.action)
                        .bind(a.now_ms)
                        .bind(a.expires_at_ms)
                        .fetch_one(&mut **tx)
                        .await
                        .map_err(map_err)?;
                    let entry = decode::message(&row)?;
                    let decision = match entry.state {
                        MessageState::Sent => ActionDecision::Done,
                        MessageState::Sending if entry.run_id == attempt => ActionDecision::Go,
                        MessageState::Sending => ActionDecision::Unknown,
                        MessageState::NotSent => ActionDecision::Go,
                    };
                    let detail = format!("{} {}: {}", a.mode.as_str(), a.action, decision.as_str());
                    event(
                        tx,
                        a.task,
                        "action",
                        t.holder.as_deref(),
                        Some(a.fence),
                        a.now_ms,
                        Some(&detail),
                    )
                    .await?;
                    if decision == ActionDecision::Unknown && a.mode == ActionMode::AtMostOnce {
                        let row = sqlx::query(&sql::ATTENTION)
                            .bind(a.task)
                            .bind(a.fence)
                            .bind(a.now_ms)
                            .fetch_one(&mut **tx)
                            .await
                            .map_err(map_err)?;
                        let why = format!("the outcome of {} is unknown", a.action);
                        event(
                            tx,
                            a.task,
                            "needs_attention",
                            None,
                            Some(a.fence),
                            a.now_ms,
                            Some(&why),
                        )
                        .await?;
                        return Ok(ActionClaim::Decided(decision, decode::task(&row)?));
                    }
                    Ok(ActionClaim::Decided(decision, t))
                }

                async fn record_action(
                    tx: &mut $tx,
                    a: &ActionAttempt<'_>,
                    outcome: ActionOutcome,
                ) -> Result<ActionClaim, StoreError> {
                    let Some(t) = locked(tx, a.tenant, a.task).await? else {
                        return Ok(ActionClaim::Missing);
                    };
                    if !holds(&t, a.fence, a.now_ms) {
                        return Ok(ActionClaim::LeaseLost(t));
                    }
                    let (sql_text, name, answer) = match outcome {
                        ActionOutcome::Done => (sql::MARK_SENT, "done", ActionDecision::Done),
                        ActionOutcome::NotSent => {
                            (sql::MARK_NOT_SENT, "not-sent", ActionDecision::Go)
                        }
                    };
                    let marked = sqlx::query(sql_text)
                        .bind(a.key)
                        .bind(a.now_ms)
                        .execute(&mut **tx)
                        .await
                        .map_err(map_err)?;
                    if marked.rows_affected() == 0 {
                        let entry = sqlx::query(&$crate::runs::MESSAGE)
                            .bind(a.key)
                            .fetch_optional(&mut **tx)
                            .await
                            .map_err(map_err)?;
                        return Ok(match entry {
                            // Reported not sent, recorded sent: it was done.
                            Some(_) => ActionClaim::Decided(ActionDecision::Done, t),
                            None => ActionClaim::NoAttempt(t),
                        });
                    }
                    let detail = match a.detail {
                        Some(d) => format!("{}: {name} ({d})", a.action),
                        None => format!("{}: {name}", a.action),
                    };
                    event(
                        tx,
                        a.task,
                        "action_result",
                        t.holder.as_deref(),
                        Some(a.fence),
                        a.now_ms,
                        Some(&detail),
                    )
                    .await?;
                    if outcome == ActionOutcome::NotSent {
                        // The answer is go: this claim's attempt is
                        // recorded before it, as an asked go is.
                        sqlx::query($crate::runs::$d::CLAIM_MESSAGE)
                            .bind(a.key)
                            .bind(format!("{}@{}", a.task, a.fence))
                            .bind(a.action)
                            .bind(a.now_ms)
                            .bind(a.expires_at_ms)
                            .fetch_one(&mut **tx)
                            .await
                            .map_err(map_err)?;
                    }
                    Ok(ActionClaim::Decided(answer, t))
                }

                async fn steer(
                    tx: &mut $tx,
                    task: &str,
                    steer: Steer<'_>,
                    actor: &str,
                    now_ms: i64,
                ) -> Result<Steered, StoreError> {
                    let row = sqlx::query(&sql::$d::LOCK_TASK)
                        .bind(task)
                        .fetch_optional(&mut **tx)
                        .await
                        .map_err(map_err)?;
                    let Some(t) = row.as_ref().map(decode::task).transpose()? else {
                        return Ok(Steered::Missing);
                    };
                    let (kind, detail) = match steer {
                        Steer::Retry => {
                            if !matches!(t.state, TaskState::Dead | TaskState::NeedsAttention) {
                                return Ok(Steered::NotApplicable(t));
                            }
                            ("retried", None)
                        }
                        Steer::Resolve { action, key, sent } => {
                            if t.state != TaskState::NeedsAttention {
                                return Ok(Steered::NotApplicable(t));
                            }
                            let mark = if sent {
                                sql::MARK_SENT
                            } else {
                                sql::MARK_NOT_SENT
                            };
                            let marked = sqlx::query(mark)
                                .bind(key)
                                .bind(now_ms)
                                .execute(&mut **tx)
                                .await
                                .map_err(map_err)?;
                            if marked.rows_affected() == 0 {
                                return Ok(Steered::NotApplicable(t));
                            }
                            let how = if sent { "sent" } else { "not sent" };
                            ("resolved", Some(format!("{action}: {how}")))
                        }
                    };
                    let row = sqlx::query(&sql::REVIVE)
                        .bind(task)
                        .bind(now_ms)
                        .fetch_one(&mut **tx)
                        .await
                        .map_err(map_err)?;
                    let revived = decode::task(&row)?;
                    event(
                        tx,
                        task,
                        kind,
                        Some(actor),
                        Some(revived.fence),
                        now_ms,
                        detail.as_deref(),
                    )
                    .await?;
                    Ok(Steered::Done(revived))
                }

                async fn has_due(
                    &self,
                    tenant: &str,
                    queue: &str,
                    now_ms: i64,
                ) -> Result<bool, StoreError> {
                    self.bounded(async {
                        sqlx::query_scalar(sql::HAS_DUE)
                            .bind(tenant)
                            .bind(queue)
                            .bind(now_ms)
                            .fetch_one(self.pool())
                            .await
                            .map_err(|e| self.map(e))
                    })
                    .await
                }

                async fn load_task(&self, id: &str) -> Result<Option<TaskRecord>, StoreError> {
                    self.bounded(async {
                        let row = sqlx::query(&sql::TASK)
                            .bind(id)
                            .fetch_optional(self.pool())
                            .await
                            .map_err(|e| self.map(e))?;
                        row.as_ref().map(decode::task).transpose()
                    })
                    .await
                }

                async fn task_events(&self, id: &str) -> Result<Vec<TaskEvent>, StoreError> {
                    self.bounded(async {
                        let rows = sqlx::query(sql::EVENTS)
                            .bind(id)
                            .fetch_all(self.pool())
                            .await
                            .map_err(|e| self.map(e))?;
                        rows.iter().map(decode::task_event).collect()
                    })
                    .await
                }

                async fn list_tasks(&self, f: &TaskFilter) -> Result<Vec<TaskRecord>, StoreError> {
                    self.bounded(async {
                        let (created, id) = match &f.before {
                            Some((c, i)) => (Some(*c), Some(i.as_str())),
                            None => (None, None),
                        };
                        let rows = sqlx::query(&sql::$d::LIST)
                            .bind(f.queue.as_deref())
                            .bind(f.state.map(TaskState::as_str))
                            .bind(created)
                            .bind(id)
                            .bind(i64::from(f.limit))
                            .fetch_all(self.pool())
                            .await
                            .map_err(|e| self.map(e))?;
                        rows.iter().map(decode::task).collect()
                    })
                    .await
                }

                async fn purge_tasks(&self, before_ms: i64, limit: u32) -> Result<u64, StoreError> {
                    self.purge($crate::purge::$d::TASKS, before_ms, limit).await
                }

                async fn count_tasks(&self) -> Result<Vec<(String, TaskState, u64)>, StoreError> {
                    self.bounded(async {
                        let rows = sqlx::query(sql::COUNT)
                            .fetch_all(self.pool())
                            .await
                            .map_err(|e| self.map(e))?;
                        rows.iter().map(decode::task_count).collect()
                    })
                    .await
                }
            }
        };
    };
}
