//! Runs, steps and the send-once ledger on SQLite: [`RunStore`](idem_core::steps::RunStore)
//! for [`SqliteStore`] (this backend's part of what idem-sql writes once), from [`idem_sql::runs`]. One writer at a time
//! (`BEGIN IMMEDIATE`), so a takeover and a fenced write never interleave,
//! and two claimers never take the same run: each of these is a
//! transaction of several statements.

use idem_core::steps::{Fence, NewRun, RunId, RunRecord};
use idem_core::{Operation, StoreError};
use idem_sql::decode;
use idem_sql::dialect::{Dialect, On, Stmt};
use idem_sql::row::get;
use idem_sql::runs::sqlite as sql;
use idem_sql::runs::{
    NEVER_MS, RunWrite, Takeover, change_stmt, claim_due_stmt, new_run_stmt, steps_of,
    take_over_stmt,
};
use sqlx::SqliteConnection;

use crate::{SqliteDialect, map_err};

async fn execute(conn: &mut SqliteConnection, s: Stmt<'_>) -> Result<u64, StoreError> {
    SqliteDialect::execute(On::Conn(conn), s)
        .await
        .map_err(map_err)
}

/// The fenced write, its step, its ledger mark and the key's expiry, on one
/// connection inside a transaction.
pub(crate) async fn record_in(
    conn: &mut SqliteConnection,
    w: RunWrite<'_>,
) -> Result<bool, StoreError> {
    let Some(run) = SqliteDialect::fetch_optional(On::Conn(conn), change_stmt(sql::UPDATE_RUN, &w))
        .await
        .map_err(map_err)?
    else {
        return Ok(false);
    };
    if let Some(s) = w.step {
        let upsert = Stmt::new(sql::UPSERT_STEP)
            .bind(w.lease.run.as_str())
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
            .bind(w.now_ms)
            .bind(i64::from(s.failures));
        execute(conn, upsert).await?;
    }
    if let Some((message_id, state)) = w.change.message {
        let mark = Stmt::new(sql::MARK_MESSAGE)
            .bind(message_id)
            .bind(state.as_str())
            .bind(w.lease.run.as_str())
            .bind(w.now_ms);
        execute(conn, mark).await?;
    }
    if let Some(expires) = w.change.expires_at_ms {
        let expiry = Stmt::new(sql::KEY_EXPIRY)
            .bind(get::<String, _>(&run, "tenant_id")?)
            .bind(get::<String, _>(&run, "operation")?)
            .bind(get::<String, _>(&run, "idempotency_key")?)
            .bind(expires);
        execute(conn, expiry).await?;
    }
    Ok(true)
}

/// A new run of the key being claimed, in the claim's transaction.
pub(crate) async fn create_run(
    conn: &mut SqliteConnection,
    run: &NewRun<'_>,
) -> Result<Fence, StoreError> {
    // A final run of this id is left from a key record that expired:
    // it goes, with its steps. A live one would mean two runs of one key.
    let state = Stmt::new(sql::RUN_STATE).bind(run.id.as_str());
    let existing = SqliteDialect::fetch_optional(On::Conn(conn), state)
        .await
        .map_err(map_err)?;
    let existing: Option<(String, i64)> = match existing {
        Some(row) => Some((get(&row, "state")?, get(&row, "fence")?)),
        None => None,
    };
    let fence = match existing {
        None => 1,
        Some((state, fence)) if state == "completed" || state == "failed" => {
            execute(conn, Stmt::new(sql::DELETE_RUN).bind(run.id.as_str())).await?;
            fence + 1
        }
        Some((state, _)) => {
            return Err(StoreError::Corrupt {
                detail: format!("a {state} run holds the key being claimed"),
            });
        }
    };
    execute(conn, new_run_stmt(sql::INSERT_RUN, run).bind(fence)).await?;
    let expiry = Stmt::new(sql::KEY_EXPIRY)
        .bind(run.scope.tenant.as_str())
        .bind(run.scope.operation.as_str())
        .bind(run.scope.key.as_str())
        .bind(NEVER_MS);
    execute(conn, expiry).await?;
    Ok(Fence(fence))
}

impl SqliteDialect {
    /// A fenced write in its own `BEGIN IMMEDIATE` transaction.
    pub(crate) async fn record_alone(&self, w: RunWrite<'_>) -> Result<bool, StoreError> {
        let mut tx = self.begin_immediate().await?;
        if !record_in(&mut tx, w).await? {
            tx.rollback().await.map_err(|e| self.map(e))?;
            return Ok(false);
        }
        self.commit_tx(tx).await?;
        Ok(true)
    }

    /// The takeover and the read of the run's steps, in one transaction.
    pub(crate) async fn take_over_in_tx(
        &self,
        id: &RunId,
        t: Takeover<'_>,
    ) -> Result<Option<RunRecord>, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let row = Self::fetch_optional(On::Conn(&mut *tx), take_over_stmt(id, t))
            .await
            .map_err(|e| self.map(e))?;
        let Some(row) = row else {
            tx.rollback().await.map_err(|e| self.map(e))?;
            return Ok(None);
        };
        let mut runs = vec![decode::run(&row)?];
        steps_of::<Self>(&mut tx, &mut runs).await?;
        self.commit_tx(tx).await?;
        Ok(runs.pop())
    }

    /// The due runs of `operations`, taken over, with their steps, in one
    /// transaction.
    pub(crate) async fn claim_due_in_tx(
        &self,
        operations: &[Operation],
        t: Takeover<'_>,
        limit: u32,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let claim = claim_due_stmt::<Self>(operations, t, limit);
        let claimed = Self::fetch_all(On::Conn(&mut *tx), claim)
            .await
            .map_err(|e| self.map(e))?;
        let mut due = claimed
            .iter()
            .map(decode::run)
            .collect::<Result<Vec<_>, _>>()?;
        steps_of::<Self>(&mut tx, &mut due).await?;
        self.commit_tx(tx).await?;
        due.sort_by_key(|r| r.updated_at_ms);
        Ok(due)
    }
}
