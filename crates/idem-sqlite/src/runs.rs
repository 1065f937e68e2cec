//! Runs, steps and the send-once ledger on SQLite: [`RunStore`] for
//! [`SqliteStore`]. One writer at a time (`BEGIN IMMEDIATE`), so a takeover
//! and a fenced write never interleave, and two claimers never take the same
//! run.

use idem_core::StoreError;
use idem_core::steps::{
    Fence, Lease, MessageClaim, MessageColumns, Namespace, NewRun, RunChange, RunColumns,
    RunFilter, RunId, RunRecord, RunStore, SentMessage, StepColumns, StepRecord, attach_steps,
};
use idem_core::{Operation, Scope};
use idem_sql::columns::{MESSAGE_COLUMNS, RUN_COLUMNS, STEP_COLUMNS};
use sqlx::SqliteConnection;
use sqlx::sqlite::SqliteRow;

use crate::{SqliteStore, SqliteTx, column, map_err};

/// A key record's expiry while its run lives: never.
const NEVER_MS: i64 = i64::MAX;

pub(crate) fn decode_run(row: &SqliteRow) -> Result<RunRecord, StoreError> {
    RunColumns {
        id: column(row, "id")?,
        tenant_id: column(row, "tenant_id")?,
        operation: column(row, "operation")?,
        idempotency_key: column(row, "idempotency_key")?,
        state: column(row, "state")?,
        input: column(row, "input")?,
        recovery_point: column(row, "recovery_point")?,
        failure: column(row, "failure")?,
        blocked_step: column(row, "blocked_step")?,
        attention: column(row, "attention")?,
        no_return: column(row, "no_return")?,
        holder: column(row, "holder")?,
        locked_until_ms: column(row, "locked_until_ms")?,
        fence: column(row, "fence")?,
        takeovers: column(row, "takeovers")?,
        deadline_ms: column(row, "deadline_ms")?,
        ttl_ms: column(row, "ttl_ms")?,
        created_at_ms: column(row, "created_at_ms")?,
        updated_at_ms: column(row, "updated_at_ms")?,
        finished_at_ms: column(row, "finished_at_ms")?,
    }
    .decode()
}

fn decode_step(row: &SqliteRow) -> Result<(String, StepRecord), StoreError> {
    StepColumns {
        run_id: column(row, "run_id")?,
        name: column(row, "name")?,
        seq: column(row, "seq")?,
        kind: column(row, "kind")?,
        state: column(row, "state")?,
        attempts: column(row, "attempts")?,
        failures: column(row, "failures")?,
        step_key: column(row, "step_key")?,
        fence: column(row, "fence")?,
        result: column(row, "result")?,
        error: column(row, "error")?,
        started_at_ms: column(row, "started_at_ms")?,
        finished_at_ms: column(row, "finished_at_ms")?,
        updated_at_ms: column(row, "updated_at_ms")?,
    }
    .decode()
}

fn decode_message(row: &SqliteRow) -> Result<SentMessage, StoreError> {
    MessageColumns {
        message_id: column(row, "message_id")?,
        run_id: column(row, "run_id")?,
        step: column(row, "step")?,
        state: column(row, "state")?,
        attempts: column(row, "attempts")?,
        created_at_ms: column(row, "created_at_ms")?,
        sent_at_ms: column(row, "sent_at_ms")?,
    }
    .decode()
}

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

/// A `not_sent` entry is anyone's; a run's own `sending` entry is claimed
/// again (one more attempt); anything else is returned as it is.
const CLAIM_MESSAGE: &str = "\
INSERT INTO idem_send_once (message_id, run_id, step, state, attempts, created_at_ms,
                            updated_at_ms, expires_at_ms)
VALUES (?1, ?2, ?3, 'sending', 1, ?4, ?4, ?5)
ON CONFLICT (message_id) DO UPDATE SET
    run_id = CASE WHEN idem_send_once.state = 'not_sent' THEN excluded.run_id
                  ELSE idem_send_once.run_id END,
    step = CASE WHEN idem_send_once.state = 'not_sent' THEN excluded.step
                ELSE idem_send_once.step END,
    attempts = idem_send_once.attempts +
        CASE WHEN idem_send_once.state = 'not_sent'
               OR (idem_send_once.state = 'sending' AND idem_send_once.run_id = excluded.run_id)
             THEN 1 ELSE 0 END,
    state = CASE WHEN idem_send_once.state = 'not_sent' THEN 'sending'
                 ELSE idem_send_once.state END,
    updated_at_ms = excluded.updated_at_ms,
    expires_at_ms = MAX(idem_send_once.expires_at_ms, excluded.expires_at_ms)
RETURNING message_id, run_id, step, state, attempts, created_at_ms, sent_at_ms";

/// The fenced write, its step, its ledger mark and the key's expiry, on one
/// connection inside a transaction.
async fn record_on(
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

async fn steps_of(conn: &mut SqliteConnection, runs: &mut [RunRecord]) -> Result<(), StoreError> {
    if runs.is_empty() {
        return Ok(());
    }
    let ids = serde_json::Value::from(
        runs.iter()
            .map(|r| r.id.as_str().to_owned())
            .collect::<Vec<_>>(),
    )
    .to_string();
    let rows = sqlx::query(&format!(
        "SELECT {STEP_COLUMNS} FROM idem_run_steps
         WHERE run_id IN (SELECT value FROM json_each(?1)) ORDER BY run_id, seq"
    ))
    .bind(ids)
    .fetch_all(&mut *conn)
    .await
    .map_err(map_err)?;
    let steps = rows
        .iter()
        .map(decode_step)
        .collect::<Result<Vec<_>, _>>()?;
    attach_steps(runs, steps);
    Ok(())
}

fn operations_json(operations: &[Operation]) -> String {
    serde_json::Value::from(
        operations
            .iter()
            .map(|o| o.as_str().to_owned())
            .collect::<Vec<_>>(),
    )
    .to_string()
}

impl SqliteStore {
    async fn create_run_on(
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

impl RunStore for SqliteStore {
    async fn namespace(&self) -> Result<Namespace, StoreError> {
        // Read first: a read takes no write lock (the caller may hold it).
        let kept: Option<String> =
            sqlx::query_scalar("SELECT value FROM idem_meta WHERE name = 'namespace'")
                .fetch_optional(self.pool())
                .await
                .map_err(|e| self.map(e))?;
        if let Some(value) = kept {
            return Namespace::new(value).map_err(|e| StoreError::Corrupt {
                detail: e.to_string(),
            });
        }
        let drawn = Namespace::generate();
        let value: String = sqlx::query_scalar(
            "INSERT INTO idem_meta (name, value) VALUES ('namespace', ?1)
             ON CONFLICT (name) DO UPDATE SET value = idem_meta.value RETURNING value",
        )
        .bind(drawn.as_str())
        .fetch_one(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        Namespace::new(value).map_err(|e| StoreError::Corrupt {
            detail: e.to_string(),
        })
    }

    async fn create_run(tx: &mut SqliteTx, run: &NewRun<'_>) -> Result<Fence, StoreError> {
        Self::create_run_on(tx, run).await
    }

    async fn record_run_in(
        tx: &mut SqliteTx,
        lease: &Lease,
        change: &RunChange<'_>,
        step: Option<&StepRecord>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        record_on(tx, lease, change, step, now_ms).await
    }

    async fn record_run(
        &self,
        lease: &Lease,
        change: &RunChange<'_>,
        step: Option<&StepRecord>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let written = record_on(&mut tx, lease, change, step, now_ms).await?;
        if !written {
            tx.rollback().await.map_err(|e| self.map(e))?;
            return Ok(false);
        }
        self.commit_tx(tx).await?;
        Ok(true)
    }

    async fn claim_message(
        tx: &mut SqliteTx,
        claim: &MessageClaim<'_>,
    ) -> Result<SentMessage, StoreError> {
        let row = sqlx::query(CLAIM_MESSAGE)
            .bind(claim.message_id)
            .bind(claim.run.as_str())
            .bind(claim.step)
            .bind(claim.now_ms)
            .bind(claim.expires_at_ms)
            .fetch_one(&mut **tx)
            .await
            .map_err(map_err)?;
        decode_message(&row)
    }

    async fn message(&self, message_id: &str) -> Result<Option<SentMessage>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM idem_send_once WHERE message_id = ?1"
        ))
        .bind(message_id)
        .fetch_optional(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        row.as_ref().map(decode_message).transpose()
    }

    async fn take_over(
        &self,
        id: &RunId,
        holder: &str,
        now_ms: i64,
        locked_until_ms: i64,
    ) -> Result<Option<RunRecord>, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let row = sqlx::query(&format!(
            "UPDATE idem_runs SET fence = fence + 1, holder = ?2, locked_until_ms = ?4,
                 takeovers = takeovers + 1, updated_at_ms = ?3
             WHERE id = ?1 AND state IN ('running', 'compensating') AND locked_until_ms <= ?3
             RETURNING {RUN_COLUMNS}"
        ))
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
        let mut runs = vec![decode_run(&row)?];
        steps_of(&mut tx, &mut runs).await?;
        self.commit_tx(tx).await?;
        Ok(runs.pop())
    }

    async fn claim_due(
        &self,
        operations: &[Operation],
        holder: &str,
        now_ms: i64,
        locked_until_ms: i64,
        limit: u32,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let rows = sqlx::query(&format!(
            "UPDATE idem_runs SET fence = fence + 1, holder = ?1, locked_until_ms = ?3,
                 takeovers = takeovers + 1, updated_at_ms = ?2
             WHERE id IN (SELECT id FROM idem_runs
                          WHERE state IN ('running', 'compensating') AND locked_until_ms <= ?2
                            AND operation IN (SELECT value FROM json_each(?4))
                          ORDER BY locked_until_ms LIMIT ?5)
             RETURNING {RUN_COLUMNS}"
        ))
        .bind(holder)
        .bind(now_ms)
        .bind(locked_until_ms)
        .bind(operations_json(operations))
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| self.map(e))?;
        let mut runs = rows.iter().map(decode_run).collect::<Result<Vec<_>, _>>()?;
        steps_of(&mut tx, &mut runs).await?;
        self.commit_tx(tx).await?;
        runs.sort_by_key(|r| r.updated_at_ms);
        Ok(runs)
    }

    async fn load_run(&self, id: &RunId) -> Result<Option<RunRecord>, StoreError> {
        let mut conn = self.pool().acquire().await.map_err(|e| self.map(e))?;
        let row = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM idem_runs WHERE id = ?1"
        ))
        .bind(id.as_str())
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| self.map(e))?;
        let Some(row) = row else { return Ok(None) };
        let mut runs = vec![decode_run(&row)?];
        steps_of(&mut conn, &mut runs).await?;
        Ok(runs.pop())
    }

    async fn count_runs(&self) -> Result<Vec<(idem_core::steps::RunState, u64)>, StoreError> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT state, COUNT(*) FROM idem_runs GROUP BY state ORDER BY state")
                .fetch_all(self.pool())
                .await
                .map_err(|e| self.map(e))?;
        Ok(rows
            .into_iter()
            .filter_map(|(s, n)| {
                Some((
                    idem_core::steps::RunState::parse(&s)?,
                    u64::try_from(n).ok()?,
                ))
            })
            .collect())
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM idem_runs WHERE (?1 IS NULL OR state = ?1)
             ORDER BY created_at_ms DESC, id DESC LIMIT ?2"
        ))
        .bind(filter.state.map(|s| s.as_str()))
        .bind(i64::from(filter.limit.clamp(1, 1000)))
        .fetch_all(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        rows.iter().map(decode_run).collect()
    }

    async fn purge_runs(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM idem_runs WHERE rowid IN
             (SELECT rowid FROM idem_runs WHERE expires_at_ms <= ?1
                AND state IN ('completed', 'failed') LIMIT ?2)",
        )
        .bind(now_ms)
        .bind(i64::from(limit))
        .execute(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        Ok(done.rows_affected())
    }

    async fn purge_messages(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM idem_send_once WHERE rowid IN
             (SELECT rowid FROM idem_send_once WHERE expires_at_ms <= ?1 LIMIT ?2)",
        )
        .bind(now_ms)
        .bind(i64::from(limit))
        .execute(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        Ok(done.rows_affected())
    }
}
