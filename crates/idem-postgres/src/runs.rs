//! Runs, steps and the send-once ledger on PostgreSQL: [`RunStore`](idem_core::steps::RunStore) for
//! [`PgStore`]. A fenced write is one statement (the run's conditional
//! `UPDATE` with its step, ledger mark and key expiry in CTEs), so outside a
//! phase it costs one round trip. Several executors and recovery workers may
//! share the database: takeovers lock the row and re-check the lease, and
//! `claim_due` skips rows another claimer holds (`FOR UPDATE SKIP LOCKED`).

use idem_core::steps::{Fence, NewRun, RunId, RunRecord};
use idem_core::{Operation, StoreError};
use idem_sql::decode;
use idem_sql::row::get;
use idem_sql::runs::postgres as sql;
use idem_sql::runs::{NEVER_MS, RunWrite, Takeover};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{PgConnection, Postgres};

use crate::pool::text_list;
use crate::{PgStore, PgTx, map_err};

idem_sql::run_store!(PgStore, PgTx, PgConnection, Postgres, postgres);

/// The fenced write with its step and ledger mark (`$15`..`$28`).
fn record_query<'q>(w: &RunWrite<'q>) -> Query<'q, Postgres, PgArguments> {
    let step = w.step;
    let (message, message_state) = match w.change.message {
        Some((id, state)) => (Some(id), Some(state.as_str())),
        None => (None, None),
    };
    change_query(sql::RECORD, w)
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

/// The fenced write in the caller's transaction: one statement.
async fn record_in(tx: &mut PgTx, w: RunWrite<'_>) -> Result<bool, StoreError> {
    let row = record_query(&w)
        .fetch_one(&mut **tx)
        .await
        .map_err(map_err)?;
    written(&row)
}

impl PgStore {
    /// A final run of the id is replaced, its fence carried on; a live one
    /// is an error. One statement in the claim's transaction.
    async fn create_run_here(tx: &mut PgTx, run: &NewRun<'_>) -> Result<Fence, StoreError> {
        let fence: Option<i64> = new_run_query(sql::CREATE_RUN, run)
            .bind(NEVER_MS)
            .fetch_optional(&mut **tx)
            .await
            .map_err(map_err)?
            .map(|row| get(&row, "fence"))
            .transpose()?;
        fence.map(Fence).ok_or_else(|| StoreError::Corrupt {
            detail: "a live run holds the key being claimed".into(),
        })
    }

    /// A fenced write outside a transaction: one statement is its own
    /// transaction (no BEGIN, no COMMIT).
    async fn record_here(&self, w: RunWrite<'_>) -> Result<bool, StoreError> {
        let write = record_query(&w).fetch_one(self.pool());
        written(&self.bounded_write(write).await?)
    }

    /// The takeover (autocommit), then the run's steps.
    async fn take_over_here(
        &self,
        id: &RunId,
        t: Takeover<'_>,
    ) -> Result<Option<RunRecord>, StoreError> {
        let taken = take_over_query(id, t).fetch_optional(self.pool());
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
    async fn claim_due_here(
        &self,
        operations: &[Operation],
        t: Takeover<'_>,
        limit: u32,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let claim = claim_due_query(operations, t, limit).fetch_all(self.pool());
        let claimed = self.bounded_write(claim).await?;
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
            steps_of(&mut conn, runs).await
        })
        .await
    }
}
