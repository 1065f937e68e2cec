//! Runs, steps and the send-once ledger ([`RunStore`](idem_core::steps::RunStore)):
//! the statements both dialects share, and [`run_store!`](crate::run_store).
//! The fenced write, the creation, the takeover and the due claim lock
//! differently on each backend and stay there; the step listing (a JSON
//! array on SQLite, an array on PostgreSQL), the message claim (`MAX` or
//! `GREATEST`) and the run listing (typed NULLs) differ by dialect.

use std::sync::LazyLock;

use crate::columns::{MESSAGE_COLUMNS, RUN_COLUMNS, STEP_COLUMNS};

/// A key record's expiry while its run lives: never.
pub const NEVER_MS: i64 = i64::MAX;

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
/// them) and implements [`RunStore`](idem_core::steps::RunStore) for a
/// backend's store: `run_store!(Store, Tx, Connection, dialect)`. The
/// writes that lock differently are the store's own: `create_run_here`,
/// `record_in`, `record_here`, `take_over_here` and `claim_due_here`, with
/// the trait methods' parameters. The crate provides `text_list(Vec<String>)`,
/// texts as its dialect binds a list.
#[macro_export]
macro_rules! run_store {
    ($store:ty, $tx:ty, $conn:ty, $d:ident) => {
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
                    record_in(tx, lease, change, step, now_ms).await
                }

                async fn record_run(
                    &self,
                    lease: &Lease,
                    change: &RunChange<'_>,
                    step: Option<&StepRecord>,
                    now_ms: i64,
                ) -> Result<bool, StoreError> {
                    self.record_here(lease, change, step, now_ms).await
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
                    self.take_over_here(id, holder, now_ms, locked_until_ms)
                        .await
                }

                async fn claim_due(
                    &self,
                    operations: &[Operation],
                    holder: &str,
                    now_ms: i64,
                    locked_until_ms: i64,
                    limit: u32,
                ) -> Result<Vec<RunRecord>, StoreError> {
                    let lease = (holder, now_ms, locked_until_ms);
                    self.claim_due_here(operations, lease, limit).await
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
