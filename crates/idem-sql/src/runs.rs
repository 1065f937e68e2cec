//! Runs, steps and the send-once ledger ([`RunStore`](idem_core::steps::RunStore)):
//! the statements both dialects share, and [`run_store!`](crate::run_store).
//! The fenced write, the creation, the takeover and the due claim lock
//! differently on each backend and stay there; the step listing (a JSON
//! array on SQLite, an array on PostgreSQL), the message claim (`MAX` or
//! `GREATEST`) and the run listing (typed NULLs) differ by dialect.

use std::sync::LazyLock;

use idem_core::steps::{Lease, RunChange, StepRecord};

use crate::columns::{MESSAGE_COLUMNS, RUN_COLUMNS, STEP_COLUMNS};

/// A key record's expiry while its run lives: never.
pub const NEVER_MS: i64 = i64::MAX;

/// One fenced write of a run, as a backend's `record_in` and
/// `record_here` take it: the parameters of `RunStore::record_run`.
#[derive(Clone, Copy)]
pub struct RunWrite<'a> {
    /// The lease the write is fenced by.
    pub lease: &'a Lease,
    /// What changes.
    pub change: &'a RunChange<'a>,
    /// The step written with it, if any.
    pub step: Option<&'a StepRecord>,
    /// Now.
    pub now_ms: i64,
}

/// A takeover, as a backend's `take_over_here` and `claim_due_here` take
/// it: who takes over, when, until when.
#[derive(Debug, Clone, Copy)]
pub struct Takeover<'a> {
    /// The new holder.
    pub holder: &'a str,
    /// Now.
    pub now_ms: i64,
    /// The new lease's end.
    pub locked_until_ms: i64,
}

/// The store's namespace, when drawn.
pub const NAMESPACE: &str = "SELECT value FROM idem_meta WHERE name = 'namespace'";

/// Draws the namespace `$1` unless one was drawn; answers the one kept.
pub const DRAW_NAMESPACE: &str = "\
INSERT INTO idem_meta (name, value) VALUES ('namespace', $1)
ON CONFLICT (name) DO UPDATE SET value = idem_meta.value RETURNING value";

/// One ledger entry: `$1` message id.
pub static MESSAGE: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {MESSAGE_COLUMNS} FROM idem_send_once WHERE message_id = $1"));

/// One run: `$1` id.
pub static LOAD: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {RUN_COLUMNS} FROM idem_runs WHERE id = $1"));

/// Runs per state.
pub const COUNT: &str = "SELECT state, COUNT(*) FROM idem_runs GROUP BY state ORDER BY state";

/// A takeover of `$1` (run) by `$2` (holder) at `$3` (now) until `$4`: the
/// fence moves on, only when the lease has ended.
pub static TAKE_OVER: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE idem_runs SET fence = fence + 1, holder = $2, locked_until_ms = $4,
             takeovers = takeovers + 1, updated_at_ms = $3
         WHERE id = $1 AND state IN ('running', 'compensating')
           AND locked_until_ms <= $3
         RETURNING {RUN_COLUMNS}"
    )
});

/// A `not_sent` entry is anyone's; a run's own `sending` entry is claimed
/// again (one more attempt); anything else is returned as it is. `$1`
/// message, `$2` run, `$3` step, `$4` now, `$5` expiry.
macro_rules! claim_message {
    ($greatest:literal) => {
        concat!(
            "INSERT INTO idem_send_once (message_id, run_id, step, state, attempts, created_at_ms,
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
    expires_at_ms = ",
            $greatest,
            "(idem_send_once.expires_at_ms, excluded.expires_at_ms)
RETURNING message_id, run_id, step, state, attempts, created_at_ms, sent_at_ms"
        )
    };
}

/// SQLite's texts.
pub mod sqlite {
    use super::*;

    /// The ledger claim.
    pub const CLAIM_MESSAGE: &str = claim_message!("MAX");

    /// The fenced update every write of a run goes through (`$1` run, `$2`
    /// fence, `$3`..`$14` the change: `failure` is kept once set; `$6` says
    /// whether the block is replaced by `$7`/`$8`); answers the run's scope.
    pub const UPDATE_RUN: &str = "\
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
    finished_at_ms = CASE WHEN $13 IS NULL THEN finished_at_ms ELSE $14 END,
    expires_at_ms = COALESCE($13, expires_at_ms),
    updated_at_ms = $14
WHERE id = $1 AND fence = $2
RETURNING tenant_id, operation, idempotency_key";

    /// The step written with a fenced write.
    pub const UPSERT_STEP: &str = "\
INSERT INTO idem_run_steps (run_id, name, seq, kind, state, attempts, step_key, fence, result,
                            error, started_at_ms, finished_at_ms, updated_at_ms, failures)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
ON CONFLICT (run_id, name) DO UPDATE SET
    state = excluded.state, attempts = excluded.attempts, failures = excluded.failures,
    fence = excluded.fence,
    result = excluded.result, error = excluded.error,
    started_at_ms = COALESCE(idem_run_steps.started_at_ms, excluded.started_at_ms),
    finished_at_ms = excluded.finished_at_ms, updated_at_ms = excluded.updated_at_ms";

    /// The ledger mark written with a fenced write: `$1` message, `$2`
    /// state, `$3` run, `$4` now.
    pub const MARK_MESSAGE: &str = "\
UPDATE idem_send_once SET state = $2,
    sent_at_ms = CASE WHEN $2 = 'sent' THEN $4 ELSE sent_at_ms END, updated_at_ms = $4
WHERE message_id = $1 AND run_id = $3";

    /// The key record's expiry: `$1`..`$3` the scope, `$4` the expiry.
    pub const KEY_EXPIRY: &str = "\
UPDATE idem_keys SET expires_at_ms = $4
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3";

    /// A run of the id about to be created: its state and fence.
    pub const RUN_STATE: &str = "SELECT state, fence FROM idem_runs WHERE id = $1";

    /// A final run of the id, left from a key record that expired.
    pub const DELETE_RUN: &str = "DELETE FROM idem_runs WHERE id = $1";

    /// A new run: `$1`..`$10` as [`super::postgres::CREATE_RUN`], `$11` its
    /// fence.
    pub const INSERT_RUN: &str = "\
INSERT INTO idem_runs (id, tenant_id, operation, idempotency_key, state, input, holder,
                       locked_until_ms, fence, deadline_ms, ttl_ms, created_at_ms,
                       updated_at_ms)
VALUES ($1, $2, $3, $4, 'running', $5, $6, $7, $11, $8, $9, $10, $10)";

    /// The due runs, taken over: `$1` holder, `$2` now, `$3` lease end, `$4`
    /// operations (a JSON array), `$5` limit.
    pub static CLAIM_DUE: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE idem_runs SET fence = fence + 1, holder = $1, locked_until_ms = $3,
                 takeovers = takeovers + 1, updated_at_ms = $2
             WHERE id IN (SELECT id FROM idem_runs
                          WHERE state IN ('running', 'compensating') AND locked_until_ms <= $2
                            AND operation IN (SELECT value FROM json_each($4))
                          ORDER BY locked_until_ms LIMIT $5)
             RETURNING {RUN_COLUMNS}"
        )
    });

    /// The steps of `$1` (a JSON array of run ids).
    pub static STEPS_OF: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {STEP_COLUMNS} FROM idem_run_steps
             WHERE run_id IN (SELECT value FROM json_each($1)) ORDER BY run_id, seq"
        )
    });

    /// A listing: `$1` state, `$2` limit.
    pub static LIST: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {RUN_COLUMNS} FROM idem_runs WHERE ($1 IS NULL OR state = $1)
             ORDER BY created_at_ms DESC, id DESC LIMIT $2"
        )
    });
}

/// PostgreSQL's texts.
pub mod postgres {
    use super::*;

    /// The ledger claim.
    pub const CLAIM_MESSAGE: &str = claim_message!("GREATEST");

    /// Every write of a run: the fenced update (`$1`..`$14` as SQLite's
    /// `UPDATE_RUN`), and — only when it matched — the step upsert (when
    /// `$15` names a step), the ledger mark (when `$26` names a message) and
    /// the key record's expiry (when `$13` is set). One statement, one round
    /// trip; it answers 1 when written, 0 when fenced out.
    pub const RECORD: &str = "\
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

    /// A new run (`$1` id, `$2`..`$4` the scope, `$5` input, `$6` holder,
    /// `$7` lease end, `$8` deadline, `$9` TTL, `$10` now, `$11` the key's
    /// expiry while it lives). A final run of the id (left from an expired
    /// key record) is replaced, its fence carried on; a live one is left
    /// alone and nothing is returned.
    pub const CREATE_RUN: &str = "\
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

    /// The due runs, taken over, skipping rows another claimer holds: `$1`
    /// holder, `$2` now, `$3` lease end, `$4` operations (an array), `$5`
    /// limit.
    pub static CLAIM_DUE: LazyLock<String> = LazyLock::new(|| {
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
             RETURNING {RUN_COLUMNS}"
        )
    });

    /// The steps of `$1` (an array of run ids).
    pub static STEPS_OF: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {STEP_COLUMNS} FROM idem_run_steps WHERE run_id = ANY($1) \
             ORDER BY run_id, seq"
        )
    });

    /// A listing: `$1` state, `$2` limit.
    pub static LIST: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {RUN_COLUMNS} FROM idem_runs WHERE ($1::text IS NULL OR state = $1)
             ORDER BY created_at_ms DESC, id DESC LIMIT $2"
        )
    });
}

/// Defines `steps_of(conn, runs)` (reads the steps of `runs` and attaches
/// them), `change_query(sql, write)` (binds a fenced write's `$1`..`$14`)
/// and `new_run_query(sql, run)` (binds a new run's `$1`..`$10`), and
/// implements [`RunStore`](idem_core::steps::RunStore) for a backend's
/// store: `run_store!(Store, Tx, Connection, Database, dialect)`. The
/// writes that lock differently are the store's own: `create_run_here(tx,
/// run)`, `record_in(tx, RunWrite)`, `record_here(RunWrite)`,
/// `take_over_here(id, Takeover)` and `claim_due_here(operations, Takeover,
/// limit)`. The crate provides `text_list(Vec<String>)`, texts as its
/// dialect binds a list.
#[macro_export]
macro_rules! run_store {
    ($store:ty, $tx:ty, $conn:ty, $db:ty, $d:ident) => {
        /// A fenced write's `$1` (run) .. `$14` (now) of `sql`.
        fn change_query<'q>(
            sql: &'q str,
            w: &$crate::runs::RunWrite<'q>,
        ) -> sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>> {
            let change = w.change;
            let (set_block, blocked, why) = match change.attention {
                None => (false, None, None),
                Some(None) => (true, None, None),
                Some(Some((step, why))) => (true, Some(step), Some(why)),
            };
            sqlx::query(sql)
                .bind(w.lease.run.as_str())
                .bind(w.lease.fence.0)
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
                .bind(w.now_ms)
        }

        /// The takeover of `id` ([`idem_sql::runs::TAKE_OVER`]).
        fn take_over_query<'q>(
            id: &'q idem_core::steps::RunId,
            t: $crate::runs::Takeover<'q>,
        ) -> sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>> {
            sqlx::query(&$crate::runs::TAKE_OVER)
                .bind(id.as_str())
                .bind(t.holder)
                .bind(t.now_ms)
                .bind(t.locked_until_ms)
        }

        /// The claim of the due runs of `operations`, at most `limit` (the
        /// dialect's `CLAIM_DUE`).
        fn claim_due_query<'q>(
            operations: &[idem_core::Operation],
            t: $crate::runs::Takeover<'q>,
            limit: u32,
        ) -> sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>> {
            let ops = operations.iter().map(|o| o.as_str().to_owned()).collect();
            sqlx::query(&$crate::runs::$d::CLAIM_DUE)
                .bind(t.holder)
                .bind(t.now_ms)
                .bind(t.locked_until_ms)
                .bind(text_list(ops))
                .bind(i64::from(limit))
        }

        /// A new run's `$1` (id) .. `$10` (now) of `sql`.
        fn new_run_query<'q>(
            sql: &'q str,
            run: &'q idem_core::steps::NewRun<'q>,
        ) -> sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>> {
            sqlx::query(sql)
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
        }

        /// Reads the steps of `runs` on `conn` and attaches them.
        async fn steps_of(
            conn: &mut $conn,
            runs: &mut [idem_core::steps::RunRecord],
        ) -> Result<(), idem_core::StoreError> {
            if runs.is_empty() {
                return Ok(());
            }
            let ids = runs.iter().map(|r| r.id.as_str().to_owned()).collect();
            let rows = sqlx::query(&$crate::runs::$d::STEPS_OF)
                .bind(text_list(ids))
                .fetch_all(&mut *conn)
                .await
                .map_err(map_err)?;
            let steps = rows
                .iter()
                .map($crate::decode::step)
                .collect::<Result<Vec<_>, _>>()?;
            idem_core::steps::attach_steps(runs, steps);
            Ok(())
        }

        const _: () = {
            use idem_core::steps::{
                Fence, Lease, MessageClaim, Namespace, NewRun, RunChange, RunFilter, RunId,
                RunRecord, RunState, RunStore, SentMessage, StepRecord,
            };
            use idem_core::{Operation, StoreError};
            use $crate::decode;
            use $crate::runs as sql;

            impl RunStore for $store {
                async fn namespace(&self) -> Result<Namespace, StoreError> {
                    // Read first: a read takes no write lock (the caller may hold it).
                    let kept: Option<String> = self
                        .bounded(async {
                            sqlx::query_scalar(sql::NAMESPACE)
                                .fetch_optional(self.pool())
                                .await
                                .map_err(|e| self.map(e))
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
                            sqlx::query_scalar(sql::DRAW_NAMESPACE)
                                .bind(drawn.as_str())
                                .fetch_one(self.pool()),
                        )
                        .await?;
                    Namespace::new(value).map_err(|e| StoreError::Corrupt {
                        detail: e.to_string(),
                    })
                }

                async fn create_run(tx: &mut $tx, run: &NewRun<'_>) -> Result<Fence, StoreError> {
                    Self::create_run_here(tx, run).await
                }

                async fn record_run_in(
                    tx: &mut $tx,
                    lease: &Lease,
                    change: &RunChange<'_>,
                    step: Option<&StepRecord>,
                    now_ms: i64,
                ) -> Result<bool, StoreError> {
                    let write = sql::RunWrite {
                        lease,
                        change,
                        step,
                        now_ms,
                    };
                    record_in(tx, write).await
                }

                async fn record_run(
                    &self,
                    lease: &Lease,
                    change: &RunChange<'_>,
                    step: Option<&StepRecord>,
                    now_ms: i64,
                ) -> Result<bool, StoreError> {
                    let write = sql::RunWrite {
                        lease,
                        change,
                        step,
                        now_ms,
                    };
                    self.record_here(write).await
                }

                async fn claim_message(
                    tx: &mut $tx,
                    claim: &MessageClaim<'_>,
                ) -> Result<SentMessage, StoreError> {
                    let row = sqlx::query(sql::$d::CLAIM_MESSAGE)
                        .bind(claim.message_id)
                        .bind(claim.run.as_str())
                        .bind(claim.step)
                        .bind(claim.now_ms)
                        .bind(claim.expires_at_ms)
                        .fetch_one(&mut **tx)
                        .await
                        .map_err(map_err)?;
                    decode::message(&row)
                }

                async fn message(
                    &self,
                    message_id: &str,
                ) -> Result<Option<SentMessage>, StoreError> {
                    self.bounded(async {
                        let row = sqlx::query(&sql::MESSAGE)
                            .bind(message_id)
                            .fetch_optional(self.pool())
                            .await
                            .map_err(|e| self.map(e))?;
                        row.as_ref().map(decode::message).transpose()
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
                    let takeover = sql::Takeover {
                        holder,
                        now_ms,
                        locked_until_ms,
                    };
                    self.take_over_here(id, takeover).await
                }

                async fn claim_due(
                    &self,
                    operations: &[Operation],
                    holder: &str,
                    now_ms: i64,
                    locked_until_ms: i64,
                    limit: u32,
                ) -> Result<Vec<RunRecord>, StoreError> {
                    let takeover = sql::Takeover {
                        holder,
                        now_ms,
                        locked_until_ms,
                    };
                    self.claim_due_here(operations, takeover, limit).await
                }

                async fn load_run(&self, id: &RunId) -> Result<Option<RunRecord>, StoreError> {
                    self.bounded(async {
                        let mut conn = self.pool().acquire().await.map_err(|e| self.map(e))?;
                        let row = sqlx::query(&sql::LOAD)
                            .bind(id.as_str())
                            .fetch_optional(&mut *conn)
                            .await
                            .map_err(|e| self.map(e))?;
                        let Some(row) = row else { return Ok(None) };
                        let mut runs = vec![decode::run(&row)?];
                        steps_of(&mut conn, &mut runs).await?;
                        Ok(runs.pop())
                    })
                    .await
                }

                async fn count_runs(&self) -> Result<Vec<(RunState, u64)>, StoreError> {
                    self.bounded(async {
                        let rows: Vec<(String, i64)> = sqlx::query_as(sql::COUNT)
                            .fetch_all(self.pool())
                            .await
                            .map_err(|e| self.map(e))?;
                        Ok(rows
                            .into_iter()
                            .filter_map(|(s, n)| {
                                Some((RunState::parse(&s)?, u64::try_from(n).ok()?))
                            })
                            .collect())
                    })
                    .await
                }

                async fn list_runs(
                    &self,
                    filter: &RunFilter,
                ) -> Result<Vec<RunRecord>, StoreError> {
                    self.bounded(async {
                        let rows = sqlx::query(&sql::$d::LIST)
                            .bind(filter.state.map(|s| s.as_str()))
                            .bind(i64::from(filter.limit.clamp(1, 1000)))
                            .fetch_all(self.pool())
                            .await
                            .map_err(|e| self.map(e))?;
                        rows.iter().map(decode::run).collect()
                    })
                    .await
                }

                async fn purge_runs(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
                    self.purge($crate::purge::$d::RUNS, now_ms, limit).await
                }

                async fn purge_messages(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
                    self.purge($crate::purge::$d::MESSAGES, now_ms, limit).await
                }
            }
        };
    };
}
