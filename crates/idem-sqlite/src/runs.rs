//! Runs, steps and the send-once ledger on SQLite: [`RunStore`](idem_core::steps::RunStore) for
//! [`SqliteStore`]. One writer at a time (`BEGIN IMMEDIATE`), so a takeover
//! and a fenced write never interleave, and two claimers never take the same
//! run.

use idem_core::steps::{Fence, Lease, NewRun, RunChange, RunId, RunRecord, StepRecord};
use idem_core::{Operation, Scope, StoreError};
use idem_sql::decode;
use idem_sql::runs::{NEVER_MS, TAKE_OVER};
use sqlx::SqliteConnection;

use crate::pool::text_list;
use crate::{SqliteStore, SqliteTx, map_err};

idem_sql::run_store!(SqliteStore, SqliteTx, SqliteConnection, sqlite);

/// The fenced update every write of a run goes through. `failure` is kept
/// once set; `?6` says whether the block is replaced by `?7`/`?8`.
const UPDATE_RUN: &str = "\
UPDATE idem_runs SET
    state = COALESCE(?3, state),
    recovery_point = COALESCE(?4, recovery_point),
    failure = COALESCE(failure, ?5),
    blocked_step = CASE WHEN ?6 THEN ?7 ELSE blocked_step END,
    attention = CASE WHEN ?6 THEN ?8 ELSE attention END,
    no_return = no_return OR ?9,
    locked_until_ms = COALESCE(?10, locked_until_ms),
    holder = CASE WHEN ?11 THEN NULL ELSE holder END,
    fence = fence + ?12,
    finished_at_ms = CASE WHEN ?13 IS NULL THEN finished_at_ms ELSE ?14 END,
    expires_at_ms = COALESCE(?13, expires_at_ms),
    updated_at_ms = ?14
WHERE id = ?1 AND fence = ?2
RETURNING tenant_id, operation, idempotency_key";

const UPSERT_STEP: &str = "\
INSERT INTO idem_run_steps (run_id, name, seq, kind, state, attempts, step_key, fence, result,
                            error, started_at_ms, finished_at_ms, updated_at_ms, failures)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
ON CONFLICT (run_id, name) DO UPDATE SET
    state = excluded.state, attempts = excluded.attempts, failures = excluded.failures,
    fence = excluded.fence,
    result = excluded.result, error = excluded.error,
    started_at_ms = COALESCE(idem_run_steps.started_at_ms, excluded.started_at_ms),
    finished_at_ms = excluded.finished_at_ms, updated_at_ms = excluded.updated_at_ms";

const MARK_MESSAGE: &str = "\
UPDATE idem_send_once SET state = ?2,
    sent_at_ms = CASE WHEN ?2 = 'sent' THEN ?4 ELSE sent_at_ms END, updated_at_ms = ?4
WHERE message_id = ?1 AND run_id = ?3";

const KEY_EXPIRY: &str = "\
UPDATE idem_keys SET expires_at_ms = ?4
WHERE tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3";

/// The fenced write, its step, its ledger mark and the key's expiry, on one
/// connection inside a transaction.
async fn record_in(
    conn: &mut SqliteConnection,
    lease: &Lease,
    change: &RunChange<'_>,
    step: Option<&StepRecord>,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let (set_block, blocked, why) = match change.attention {
        None => (false, None, None),
        Some(None) => (true, None, None),
        Some(Some((step, why))) => (true, Some(step), Some(why)),
    };
    let failure = change.failure.map(|f| f.to_json());
    let scope: Option<(String, String, String)> = sqlx::query_as(UPDATE_RUN)
        .bind(lease.run.as_str())
        .bind(lease.fence.0)
        .bind(change.state.map(|s| s.as_str()))
        .bind(change.recovery_point)
        .bind(failure)
        .bind(set_block)
        .bind(blocked)
        .bind(why)
        .bind(change.no_return)
        .bind(change.locked_until_ms)
        .bind(change.release)
        .bind(i64::from(change.bump_fence))
        .bind(change.expires_at_ms)
        .bind(now_ms)
        .fetch_optional(&mut *conn)
        .await
        .map_err(map_err)?;
    let Some((tenant, operation, key)) = scope else {
        return Ok(false);
    };
    if let Some(s) = step {
        sqlx::query(UPSERT_STEP)
            .bind(lease.run.as_str())
            .bind(&s.name)
            .bind(s.seq)
            .bind(s.kind.as_str())
            .bind(s.state.as_str())
            .bind(i64::from(s.attempts))
            .bind(&s.key)
            .bind(s.fence.0)
            .bind(s.result.as_deref())
            .bind(s.error.as_deref())
            .bind(s.started_at_ms)
            .bind(s.finished_at_ms)
            .bind(now_ms)
            .bind(i64::from(s.failures))
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
    }
    if let Some((message_id, state)) = change.message {
        sqlx::query(MARK_MESSAGE)
            .bind(message_id)
            .bind(state.as_str())
            .bind(lease.run.as_str())
            .bind(now_ms)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
    }
    if let Some(expires) = change.expires_at_ms {
        sqlx::query(KEY_EXPIRY)
            .bind(tenant)
            .bind(operation)
            .bind(key)
            .bind(expires)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
    }
    Ok(true)
}

impl SqliteStore {
    async fn create_run_here(
        conn: &mut SqliteConnection,
        run: &NewRun<'_>,
    ) -> Result<Fence, StoreError> {
        let Scope {
            tenant,
            operation,
            key,
        } = run.scope;
        // A final run of this id is left from a key record that expired:
        // it goes, with its steps. A live one would mean two runs of one key.
        let existing: Option<(String, i64)> =
            sqlx::query_as("SELECT state, fence FROM idem_runs WHERE id = ?1")
                .bind(run.id.as_str())
                .fetch_optional(&mut *conn)
                .await
                .map_err(map_err)?;
        let fence = match existing {
            None => 1,
            Some((state, fence)) if state == "completed" || state == "failed" => {
                sqlx::query("DELETE FROM idem_runs WHERE id = ?1")
                    .bind(run.id.as_str())
                    .execute(&mut *conn)
                    .await
                    .map_err(map_err)?;
                fence + 1
            }
            Some((state, _)) => {
                return Err(StoreError::Corrupt {
                    detail: format!("a {state} run holds the key being claimed"),
                });
            }
        };
        sqlx::query(
            "INSERT INTO idem_runs (id, tenant_id, operation, idempotency_key, state, input, holder,
                                    locked_until_ms, fence, deadline_ms, ttl_ms, created_at_ms,
                                    updated_at_ms)
             VALUES (?1, ?2, ?3, ?4, 'running', ?5, ?6, ?7, ?11, ?8, ?9, ?10, ?10)",
        )
        .bind(run.id.as_str())
        .bind(tenant.as_str())
        .bind(operation.as_str())
        .bind(key.as_str())
        .bind(run.input)
        .bind(run.holder)
        .bind(run.locked_until_ms)
        .bind(run.deadline_ms)
        .bind(run.ttl_ms)
        .bind(run.now_ms)
        .bind(fence)
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
        sqlx::query(KEY_EXPIRY)
            .bind(tenant.as_str())
            .bind(operation.as_str())
            .bind(key.as_str())
            .bind(NEVER_MS)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        Ok(Fence(fence))
    }
}

impl SqliteStore {
    /// A fenced write in its own `BEGIN IMMEDIATE` transaction.
    async fn record_here(
        &self,
        lease: &Lease,
        change: &RunChange<'_>,
        step: Option<&StepRecord>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let written = record_in(&mut tx, lease, change, step, now_ms).await?;
        if !written {
            tx.rollback().await.map_err(|e| self.map(e))?;
            return Ok(false);
        }
        self.commit_tx(tx).await?;
        Ok(true)
    }

    /// The takeover and the read of the run's steps, in one transaction.
    async fn take_over_here(
        &self,
        id: &RunId,
        holder: &str,
        now_ms: i64,
        locked_until_ms: i64,
    ) -> Result<Option<RunRecord>, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let row = sqlx::query(&TAKE_OVER)
            .bind(id.as_str())
            .bind(holder)
            .bind(now_ms)
            .bind(locked_until_ms)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| self.map(e))?;
        let Some(row) = row else {
            tx.rollback().await.map_err(|e| self.map(e))?;
            return Ok(None);
        };
        let mut runs = vec![decode::run(&row)?];
        steps_of(&mut tx, &mut runs).await?;
        self.commit_tx(tx).await?;
        Ok(runs.pop())
    }

    /// The due runs of `operations` taken over by `holder` (`lease`: the
    /// holder, now, the lease's end), with their steps, in one transaction.
    async fn claim_due_here(
        &self,
        operations: &[Operation],
        (holder, now_ms, locked_until_ms): (&str, i64, i64),
        limit: u32,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let rows = sqlx::query(&CLAIM_DUE)
            .bind(holder)
            .bind(now_ms)
            .bind(locked_until_ms)
            .bind(text_list(
                operations.iter().map(|o| o.as_str().to_owned()).collect(),
            ))
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| self.map(e))?;
        let mut runs = rows
            .iter()
            .map(decode::run)
            .collect::<Result<Vec<_>, _>>()?;
        steps_of(&mut tx, &mut runs).await?;
        self.commit_tx(tx).await?;
        runs.sort_by_key(|r| r.updated_at_ms);
        Ok(runs)
    }
}

/// The due runs, taken over: `$1` holder, `$2` now, `$3` lease end, `$4`
/// operations (a JSON array), `$5` limit.
static CLAIM_DUE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "UPDATE idem_runs SET fence = fence + 1, holder = ?1, locked_until_ms = ?3,
             takeovers = takeovers + 1, updated_at_ms = ?2
         WHERE id IN (SELECT id FROM idem_runs
                      WHERE state IN ('running', 'compensating') AND locked_until_ms <= ?2
                        AND operation IN (SELECT value FROM json_each(?4))
                      ORDER BY locked_until_ms LIMIT ?5)
         RETURNING {}",
        idem_sql::columns::RUN_COLUMNS
    )
});
