//! Runs, steps and the send-once ledger on PostgreSQL: [`RunStore`](idem_core::steps::RunStore) for
//! [`PgStore`]. A fenced write is one statement (the run's conditional
//! `UPDATE` with its step, ledger mark and key expiry in CTEs), so outside a
//! phase it costs one round trip. Several executors and recovery workers may
//! share the database: takeovers lock the row and re-check the lease, and
//! `claim_due` skips rows another claimer holds (`FOR UPDATE SKIP LOCKED`).

use idem_core::steps::{Fence, Lease, NewRun, RunChange, RunId, RunRecord, StepRecord};
use idem_core::{Operation, StoreError};
use idem_sql::decode;
use idem_sql::row::get;
use idem_sql::runs::{NEVER_MS, TAKE_OVER};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{PgConnection, Postgres};

use crate::pool::text_list;
use crate::{PgStore, PgTx, map_err};

idem_sql::run_store!(PgStore, PgTx, PgConnection, postgres);

/// Every write of a run: the fenced update (`failure` kept once set; `$6`
/// says whether the block is replaced by `$7`/`$8`), and — only when it
/// matched — the step upsert (when `$15` names a step), the ledger mark
/// (when `$26` names a message) and the key record's expiry (when `$13` is
/// set). One statement, one round trip; it answers 1 when written, 0 when
/// fenced out.
const RECORD: &str = "\
WITH r AS (
    UPDATE idem_runs SET
        state = COALESCE($3, state),
        recovery_point = COALESCE($4, recovery_point),
        failure = COALESCE(failure, $5),
        blocked_step = CASE WHEN $6 THEN $7 ELSE blocked_step END,
        attention = CASE WHEN $6 THEN $8 ELSE attention END,
        no_return = no_return OR $9,
        locked_until_ms = COALESCE($10, locked_until_ms),
        holder = CASE WHEN $11 THEN NULL ELSE holder END,
        fence = fence + $12,
        finished_at_ms = CASE WHEN $13::bigint IS NULL THEN finished_at_ms ELSE $14 END,
        expires_at_ms = COALESCE($13, expires_at_ms),
        updated_at_ms = $14
    WHERE id = $1 AND fence = $2
    RETURNING id, tenant_id, operation, idempotency_key),
s AS (
    INSERT INTO idem_run_steps (run_id, name, seq, kind, state, attempts, step_key, fence,
                                result, error, started_at_ms, finished_at_ms, updated_at_ms,
                                failures)
    SELECT r.id, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $14, $28
    FROM r WHERE $15::text IS NOT NULL
    ON CONFLICT (run_id, name) DO UPDATE SET
        state = excluded.state, attempts = excluded.attempts, failures = excluded.failures,
        fence = excluded.fence,
        result = excluded.result, error = excluded.error,
        started_at_ms = COALESCE(idem_run_steps.started_at_ms, excluded.started_at_ms),
        finished_at_ms = excluded.finished_at_ms, updated_at_ms = excluded.updated_at_ms),
m AS (
    UPDATE idem_send_once SET state = $27,
        sent_at_ms = CASE WHEN $27 = 'sent' THEN $14 ELSE sent_at_ms END, updated_at_ms = $14
    FROM r WHERE idem_send_once.message_id = $26 AND idem_send_once.run_id = r.id),
k AS (
    UPDATE idem_keys SET expires_at_ms = $13 FROM r
    WHERE $13::bigint IS NOT NULL AND idem_keys.tenant_id = r.tenant_id
      AND idem_keys.operation = r.operation AND idem_keys.idempotency_key = r.idempotency_key)
SELECT count(*) FROM r";

fn record_query<'q>(
    lease: &'q Lease,
    change: &'q RunChange<'q>,
    step: Option<&'q StepRecord>,
    now_ms: i64,
) -> Query<'q, Postgres, PgArguments> {
    let (set_block, blocked, why) = match change.attention {
        None => (false, None, None),
        Some(None) => (true, None, None),
        Some(Some((step, why))) => (true, Some(step), Some(why)),
    };
    let (message, message_state) = match change.message {
        Some((id, state)) => (Some(id), Some(state.as_str())),
        None => (None, None),
    };
    sqlx::query(RECORD)
        .bind(lease.run.as_str())
        .bind(lease.fence.0)
        .bind(change.state.map(|s| s.as_str()))
        .bind(change.recovery_point)
        .bind(change.failure.map(|f| f.to_json()))
        .bind(set_block)
        .bind(blocked)
        .bind(why)
        .bind(change.no_return)
        .bind(change.locked_until_ms)
        .bind(change.release)
        .bind(i64::from(change.bump_fence))
        .bind(change.expires_at_ms)
        .bind(now_ms)
        .bind(step.map(|s| s.name.as_str()))
        .bind(step.map(|s| s.seq))
        .bind(step.map(|s| s.kind.as_str()))
        .bind(step.map(|s| s.state.as_str()))
        .bind(step.map(|s| i32::try_from(s.attempts).unwrap_or(i32::MAX)))
        .bind(step.map(|s| s.key.as_str()))
        .bind(step.map(|s| s.fence.0))
        .bind(step.and_then(|s| s.result.as_deref()))
        .bind(step.and_then(|s| s.error.as_deref()))
        .bind(step.and_then(|s| s.started_at_ms))
        .bind(step.and_then(|s| s.finished_at_ms))
        .bind(message)
        .bind(message_state)
        .bind(step.map(|s| i32::try_from(s.failures).unwrap_or(i32::MAX)))
}

fn written(row: &PgRow) -> Result<bool, StoreError> {
    Ok(get::<i64, _>(row, "count")? == 1)
}

/// A final run of the id (left from an expired key record) is replaced,
/// its fence carried on; a live one is left alone and nothing is returned.
const CREATE_RUN: &str = "\
WITH k AS (
    UPDATE idem_keys SET expires_at_ms = $11
    WHERE tenant_id = $2 AND operation = $3 AND idempotency_key = $4),
s AS (DELETE FROM idem_run_steps WHERE run_id = $1
      AND EXISTS (SELECT 1 FROM idem_runs WHERE id = $1 AND state IN ('completed', 'failed')))
INSERT INTO idem_runs (id, tenant_id, operation, idempotency_key, state, input, holder,
                       locked_until_ms, fence, deadline_ms, ttl_ms, created_at_ms, updated_at_ms)
VALUES ($1, $2, $3, $4, 'running', $5, $6, $7, 1, $8, $9, $10, $10)
ON CONFLICT (id) DO UPDATE SET
    state = 'running', input = excluded.input, recovery_point = NULL, failure = NULL,
    blocked_step = NULL, attention = NULL, no_return = FALSE, holder = excluded.holder,
    locked_until_ms = excluded.locked_until_ms, fence = idem_runs.fence + 1, takeovers = 0,
    deadline_ms = excluded.deadline_ms, ttl_ms = excluded.ttl_ms,
    created_at_ms = excluded.created_at_ms, updated_at_ms = excluded.updated_at_ms,
    finished_at_ms = NULL, expires_at_ms = NULL
WHERE idem_runs.state IN ('completed', 'failed')
RETURNING fence";

/// The fenced write in the caller's transaction: one statement.
async fn record_in(
    tx: &mut PgTx,
    lease: &Lease,
    change: &RunChange<'_>,
    step: Option<&StepRecord>,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let row = record_query(lease, change, step, now_ms)
        .fetch_one(&mut **tx)
        .await
        .map_err(map_err)?;
    written(&row)
}

impl PgStore {
    /// A final run of the id is replaced, its fence carried on; a live one
    /// is an error.
    async fn create_run_here(tx: &mut PgTx, run: &NewRun<'_>) -> Result<Fence, StoreError> {
        let fence: Option<i64> = sqlx::query_scalar(CREATE_RUN)
            .bind(run.id.as_str())
            .bind(run.scope.tenant.as_str())
            .bind(run.scope.operation.as_str())
            .bind(run.scope.key.as_str())
            .bind(run.input)
            .bind(run.holder)
            .bind(run.locked_until_ms)
            .bind(run.deadline_ms)
            .bind(run.ttl_ms)
            .bind(run.now_ms)
            .bind(NEVER_MS)
            .fetch_optional(&mut **tx)
            .await
            .map_err(map_err)?;
        fence.map(Fence).ok_or_else(|| StoreError::Corrupt {
            detail: "a live run holds the key being claimed".into(),
        })
    }

    /// A fenced write outside a transaction: one statement is its own
    /// transaction (no BEGIN, no COMMIT).
    async fn record_here(
        &self,
        lease: &Lease,
        change: &RunChange<'_>,
        step: Option<&StepRecord>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let row = self
            .bounded_write(record_query(lease, change, step, now_ms).fetch_one(self.pool()))
            .await?;
        written(&row)
    }

    /// The takeover (autocommit), then the run's steps.
    async fn take_over_here(
        &self,
        id: &RunId,
        holder: &str,
        now_ms: i64,
        locked_until_ms: i64,
    ) -> Result<Option<RunRecord>, StoreError> {
        let row = self
            .bounded_write(
                sqlx::query(&TAKE_OVER)
                    .bind(id.as_str())
                    .bind(holder)
                    .bind(now_ms)
                    .bind(locked_until_ms)
                    .fetch_optional(self.pool()),
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        let mut runs = vec![decode::run(&row)?];
        self.with_steps(&mut runs).await?;
        Ok(runs.pop())
    }

    /// The due runs of `operations` taken over by `holder` (`lease`: the
    /// holder, now, the lease's end), skipping rows another claimer holds,
    /// then their steps.
    async fn claim_due_here(
        &self,
        operations: &[Operation],
        (holder, now_ms, locked_until_ms): (&str, i64, i64),
        limit: u32,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let ops: Vec<String> = operations.iter().map(|o| o.as_str().to_owned()).collect();
        let rows = self
            .bounded_write(
                sqlx::query(&CLAIM_DUE)
                    .bind(holder)
                    .bind(now_ms)
                    .bind(locked_until_ms)
                    .bind(ops)
                    .bind(i64::from(limit))
                    .fetch_all(self.pool()),
            )
            .await?;
        let mut runs = rows
            .iter()
            .map(decode::run)
            .collect::<Result<Vec<_>, _>>()?;
        self.with_steps(&mut runs).await?;
        Ok(runs)
    }

    /// Reads the steps of `runs` on a pooled connection.
    async fn with_steps(&self, runs: &mut [RunRecord]) -> Result<(), StoreError> {
        if runs.is_empty() {
            return Ok(());
        }
        self.bounded(async {
            let mut conn = self.pool().acquire().await.map_err(map_err)?;
            steps_of(&mut conn, runs).await
        })
        .await
    }
}

/// The due runs, taken over: `$1` holder, `$2` now, `$3` lease end, `$4`
/// operations, `$5` limit.
static CLAIM_DUE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "UPDATE idem_runs SET fence = fence + 1, holder = $1, locked_until_ms = $3,
             takeovers = takeovers + 1, updated_at_ms = $2
         WHERE id = ANY(ARRAY(
             SELECT id FROM idem_runs
             WHERE state IN ('running', 'compensating') AND locked_until_ms <= $2
               AND operation = ANY($4)
             ORDER BY locked_until_ms LIMIT $5
             FOR UPDATE SKIP LOCKED))
           AND state IN ('running', 'compensating') AND locked_until_ms <= $2
         RETURNING {}",
        idem_sql::columns::RUN_COLUMNS
    )
});
