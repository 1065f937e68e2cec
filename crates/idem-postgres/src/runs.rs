//! Runs, steps and the send-once ledger on PostgreSQL: [`RunStore`] for
//! [`PgStore`]. A fenced write is one statement (the run's conditional
//! `UPDATE` with its step, ledger mark and key expiry in CTEs), so outside a
//! phase it costs one round trip. Several executors and recovery workers may
//! share the database: takeovers lock the row and re-check the lease, and
//! `claim_due` skips rows another claimer holds (`FOR UPDATE SKIP LOCKED`).

use idem_core::Operation;
use idem_core::StoreError;
use idem_core::steps::{
    Fence, Lease, MessageClaim, MessageColumns, Namespace, NewRun, RunChange, RunColumns,
    RunFilter, RunId, RunRecord, RunStore, SentMessage, StepColumns, StepRecord, attach_steps,
};
use idem_sql::columns::{MESSAGE_COLUMNS, RUN_COLUMNS, STEP_COLUMNS};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{PgConnection, Postgres};

use crate::{PgStore, PgTx, column, map_err};

/// A key record's expiry while its run lives: never.
const NEVER_MS: i64 = i64::MAX;

pub(crate) fn decode_run(row: &PgRow) -> Result<RunRecord, StoreError> {
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

fn decode_step(row: &PgRow) -> Result<(String, StepRecord), StoreError> {
    StepColumns {
        run_id: column(row, "run_id")?,
        name: column(row, "name")?,
        seq: column(row, "seq")?,
        kind: column(row, "kind")?,
        state: column(row, "state")?,
        attempts: i64::from(column::<i32>(row, "attempts")?),
        failures: i64::from(column::<i32>(row, "failures")?),
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

fn decode_message(row: &PgRow) -> Result<SentMessage, StoreError> {
    MessageColumns {
        message_id: column(row, "message_id")?,
        run_id: column(row, "run_id")?,
        step: column(row, "step")?,
        state: column(row, "state")?,
        attempts: i64::from(column::<i32>(row, "attempts")?),
        created_at_ms: column(row, "created_at_ms")?,
        sent_at_ms: column(row, "sent_at_ms")?,
    }
    .decode()
}

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
    Ok(column::<i64>(row, "count")? == 1)
}

async fn steps_of(conn: &mut PgConnection, runs: &mut [RunRecord]) -> Result<(), StoreError> {
    if runs.is_empty() {
        return Ok(());
    }
    let ids: Vec<String> = runs.iter().map(|r| r.id.as_str().to_owned()).collect();
    let rows = sqlx::query(&format!(
        "SELECT {STEP_COLUMNS} FROM idem_run_steps WHERE run_id = ANY($1) ORDER BY run_id, seq"
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

const CLAIM_MESSAGE: &str = "\
INSERT INTO idem_send_once (message_id, run_id, step, state, attempts, created_at_ms,
                            updated_at_ms, expires_at_ms)
VALUES ($1, $2, $3, 'sending', 1, $4, $4, $5)
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
    expires_at_ms = GREATEST(idem_send_once.expires_at_ms, excluded.expires_at_ms)
RETURNING message_id, run_id, step, state, attempts, created_at_ms, sent_at_ms";

impl RunStore for PgStore {
    async fn namespace(&self) -> Result<Namespace, StoreError> {
        let kept: Option<String> = self
            .bounded(async {
                sqlx::query_scalar("SELECT value FROM idem_meta WHERE name = 'namespace'")
                    .fetch_optional(self.pool())
                    .await
                    .map_err(map_err)
            })
            .await?;
        if let Some(value) = kept {
            return Namespace::new(value).map_err(|e| StoreError::Corrupt {
                detail: e.to_string(),
            });
        }
        let drawn = Namespace::generate();
        let value: String = self
            .bounded_write(
                sqlx::query_scalar(
                    "INSERT INTO idem_meta (name, value) VALUES ('namespace', $1)
                     ON CONFLICT (name) DO UPDATE SET value = idem_meta.value RETURNING value",
                )
                .bind(drawn.as_str())
                .fetch_one(self.pool()),
            )
            .await?;
        Namespace::new(value).map_err(|e| StoreError::Corrupt {
            detail: e.to_string(),
        })
    }

    async fn create_run(tx: &mut PgTx, run: &NewRun<'_>) -> Result<Fence, StoreError> {
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

    async fn record_run_in(
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

    async fn record_run(
        &self,
        lease: &Lease,
        change: &RunChange<'_>,
        step: Option<&StepRecord>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        // One statement is its own transaction: no BEGIN, no COMMIT.
        let row = self
            .bounded_write(record_query(lease, change, step, now_ms).fetch_one(self.pool()))
            .await?;
        written(&row)
    }

    async fn claim_message(
        tx: &mut PgTx,
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
        self.bounded(async {
            let row = sqlx::query(&format!(
                "SELECT {MESSAGE_COLUMNS} FROM idem_send_once WHERE message_id = $1"
            ))
            .bind(message_id)
            .fetch_optional(self.pool())
            .await
            .map_err(map_err)?;
            row.as_ref().map(decode_message).transpose()
        })
        .await
    }

    async fn take_over(
        &self,
        id: &RunId,
        holder: &str,
        now_ms: i64,
        locked_until_ms: i64,
    ) -> Result<Option<RunRecord>, StoreError> {
        let row = self
            .bounded_write(
                sqlx::query(&format!(
                    "UPDATE idem_runs SET fence = fence + 1, holder = $2, locked_until_ms = $4,
                         takeovers = takeovers + 1, updated_at_ms = $3
                     WHERE id = $1 AND state IN ('running', 'compensating')
                       AND locked_until_ms <= $3
                     RETURNING {RUN_COLUMNS}"
                ))
                .bind(id.as_str())
                .bind(holder)
                .bind(now_ms)
                .bind(locked_until_ms)
                .fetch_optional(self.pool()),
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        let mut runs = vec![decode_run(&row)?];
        self.with_steps(&mut runs).await?;
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
        let ops: Vec<String> = operations.iter().map(|o| o.as_str().to_owned()).collect();
        let rows = self
            .bounded_write(
                sqlx::query(&format!(
                    "UPDATE idem_runs SET fence = fence + 1, holder = $1, locked_until_ms = $3,
                         takeovers = takeovers + 1, updated_at_ms = $2
                     WHERE id = ANY(ARRAY(
                         SELECT id FROM idem_runs
                         WHERE state IN ('running', 'compensating') AND locked_until_ms <= $2
                           AND operation = ANY($4)
                         ORDER BY locked_until_ms LIMIT $5
                         FOR UPDATE SKIP LOCKED))
                       AND state IN ('running', 'compensating') AND locked_until_ms <= $2
                     RETURNING {RUN_COLUMNS}"
                ))
                .bind(holder)
                .bind(now_ms)
                .bind(locked_until_ms)
                .bind(ops)
                .bind(i64::from(limit))
                .fetch_all(self.pool()),
            )
            .await?;
        let mut runs = rows.iter().map(decode_run).collect::<Result<Vec<_>, _>>()?;
        self.with_steps(&mut runs).await?;
        Ok(runs)
    }

    async fn load_run(&self, id: &RunId) -> Result<Option<RunRecord>, StoreError> {
        let row = self
            .bounded(async {
                sqlx::query(&format!(
                    "SELECT {RUN_COLUMNS} FROM idem_runs WHERE id = $1"
                ))
                .bind(id.as_str())
                .fetch_optional(self.pool())
                .await
                .map_err(map_err)
            })
            .await?;
        let Some(row) = row else { return Ok(None) };
        let mut runs = vec![decode_run(&row)?];
        self.with_steps(&mut runs).await?;
        Ok(runs.pop())
    }

    async fn count_runs(&self) -> Result<Vec<(idem_core::steps::RunState, u64)>, StoreError> {
        self.bounded(async {
            let rows: Vec<(String, i64)> = sqlx::query_as(
                "SELECT state, COUNT(*) FROM idem_runs GROUP BY state ORDER BY state",
            )
            .fetch_all(self.pool())
            .await
            .map_err(map_err)?;
            Ok(rows
                .into_iter()
                .filter_map(|(s, n)| {
                    Some((
                        idem_core::steps::RunState::parse(&s)?,
                        u64::try_from(n).ok()?,
                    ))
                })
                .collect())
        })
        .await
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        self.bounded(async {
            let rows = sqlx::query(&format!(
                "SELECT {RUN_COLUMNS} FROM idem_runs WHERE ($1::text IS NULL OR state = $1)
                 ORDER BY created_at_ms DESC, id DESC LIMIT $2"
            ))
            .bind(filter.state.map(|s| s.as_str()))
            .bind(i64::from(filter.limit.clamp(1, 1000)))
            .fetch_all(self.pool())
            .await
            .map_err(map_err)?;
            rows.iter().map(decode_run).collect()
        })
        .await
    }

    async fn purge_runs(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
        self.bounded(async {
            let done = sqlx::query(
                "DELETE FROM idem_runs WHERE ctid = ANY(ARRAY(
                     SELECT ctid FROM idem_runs WHERE expires_at_ms <= $1
                       AND state IN ('completed', 'failed')
                     LIMIT $2 FOR UPDATE SKIP LOCKED))",
            )
            .bind(now_ms)
            .bind(i64::from(limit))
            .execute(self.pool())
            .await
            .map_err(map_err)?;
            Ok(done.rows_affected())
        })
        .await
    }

    async fn purge_messages(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
        self.bounded(async {
            let done = sqlx::query(
                "DELETE FROM idem_send_once WHERE ctid = ANY(ARRAY(
                     SELECT ctid FROM idem_send_once WHERE expires_at_ms <= $1
                     LIMIT $2 FOR UPDATE SKIP LOCKED))",
            )
            .bind(now_ms)
            .bind(i64::from(limit))
            .execute(self.pool())
            .await
            .map_err(map_err)?;
            Ok(done.rows_affected())
        })
        .await
    }
}

impl PgStore {
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
