//! Runs, steps and the send-once ledger on PostgreSQL: [`RunStore`](idem_core::steps::RunStore) for
//! [`PgStore`]. A fenced write is one statement (the run's conditional
//! `UPDATE` with its step, ledger mark and key expiry in CTEs), so outside a
//! phase it costs one round trip. Several executors and recovery workers may
//! share the database: takeovers lock the row and re-check the lease, and
//! `claim_due` skips rows another claimer holds (`FOR UPDATE SKIP LOCKED`).

use idem_core::steps::{Fence, NewRun, RunId, RunRecord};
use idem_core::{Operation, StoreError};
use idem_sql::decode;
use idem_sql::dialect::{Dialect, On, Stmt, fetch_one};
use idem_sql::row::get;
use idem_sql::runs::postgres as sql;
use idem_sql::runs::{
    NEVER_MS, RunWrite, Takeover, change_stmt, claim_due_stmt, new_run_stmt, steps_of,
    take_over_stmt,
};
use sqlx::postgres::PgRow;

use crate::{PgDialect, PgTx, map_err};

/// The fenced write with its step and ledger mark (`$15`..`$28`).
fn record_stmt<'a>(w: &RunWrite<'a>) -> Stmt<'a> {
    let step = w.step;
    let (message, message_state) = match w.change.message {
        Some((id, state)) => (Some(id), Some(state.as_str())),
        None => (None, None),
    };
    change_stmt(sql::RECORD, w)
        .bind(step.map(|s| s.name.as_str()))
        .bind(step.map(|s| s.seq))
        .bind(step.map(|s| s.kind.as_str()))
        .bind(step.map(|s| s.state.as_str()))
        .opt_int(step.map(|s| i64::from(s.attempts)))
        .bind(step.map(|s| s.key.as_str()))
        .bind(step.map(|s| s.fence.0))
        .bind(step.and_then(|s| s.result.as_deref()))
        .bind(step.and_then(|s| s.error.as_deref()))
        .bind(step.and_then(|s| s.started_at_ms))
        .bind(step.and_then(|s| s.finished_at_ms))
        .bind(message)
        .bind(message_state)
        .opt_int(step.map(|s| i64::from(s.failures)))
}

fn written(row: &PgRow) -> Result<bool, StoreError> {
    Ok(get::<i64, _>(row, "count")? == 1)
}

/// The fenced write in the caller's transaction: one statement.
pub(crate) async fn record_in(tx: &mut PgTx, w: RunWrite<'_>) -> Result<bool, StoreError> {
    let row = fetch_one::<PgDialect>(On::Conn(&mut **tx), record_stmt(&w))
        .await
        .map_err(map_err)?;
    written(&row)
}

/// A final run of the id is replaced, its fence carried on; a live one is
/// an error. One statement in the claim's transaction.
pub(crate) async fn create_run(tx: &mut PgTx, run: &NewRun<'_>) -> Result<Fence, StoreError> {
    let create = new_run_stmt(sql::CREATE_RUN, run).bind(NEVER_MS);
    let fence: Option<i64> = PgDialect::fetch_optional(On::Conn(&mut **tx), create)
        .await
        .map_err(map_err)?
        .map(|row| get(&row, "fence"))
        .transpose()?;
    fence.map(Fence).ok_or_else(|| StoreError::Corrupt {
        detail: "a live run holds the key being claimed".into(),
    })
}

impl PgDialect {
    /// A fenced write outside a transaction: one statement is its own
    /// transaction (no BEGIN, no COMMIT).
    pub(crate) async fn record_alone(&self, w: RunWrite<'_>) -> Result<bool, StoreError> {
        let write = fetch_one::<Self>(On::Pool(self.pool()), record_stmt(&w));
        written(&self.bounded_write(write).await?)
    }

    /// The takeover (autocommit), then the run's steps.
    pub(crate) async fn take_over_alone(
        &self,
        id: &RunId,
        t: Takeover<'_>,
    ) -> Result<Option<RunRecord>, StoreError> {
        let taken = Self::fetch_optional(On::Pool(self.pool()), take_over_stmt(id, t));
        let Some(row) = self.bounded_write(taken).await? else {
            return Ok(None);
        };
        let mut run = [decode::run(&row)?];
        self.with_steps(&mut run).await?;
        let [run] = run;
        Ok(Some(run))
    }

    /// The due runs of `operations`, taken over (autocommit, skipping rows
    /// another claimer holds), then their steps.
    pub(crate) async fn claim_due_alone(
        &self,
        operations: &[Operation],
        t: Takeover<'_>,
        limit: u32,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let claim = claim_due_stmt::<Self>(operations, t, limit);
        let claimed = self
            .bounded_write(Self::fetch_all(On::Pool(self.pool()), claim))
            .await?;
        let mut due: Vec<RunRecord> = claimed.iter().map(decode::run).collect::<Result<_, _>>()?;
        self.with_steps(&mut due).await?;
        Ok(due)
    }

    /// Reads the steps of `runs` on a pooled connection.
    async fn with_steps(&self, runs: &mut [RunRecord]) -> Result<(), StoreError> {
        if runs.is_empty() {
            return Ok(());
        }
        self.bounded(async {
            let mut conn = self.pool().acquire().await.map_err(map_err)?;
            steps_of::<Self>(&mut conn, runs).await
        })
        .await
    }
}
