//! Runs, steps and the send-once ledger on SQLite: [`RunStore`](idem_core::steps::RunStore)
//! for [`SqliteStore`], from [`idem_sql::runs`]. One writer at a time
//! (`BEGIN IMMEDIATE`), so a takeover and a fenced write never interleave,
//! and two claimers never take the same run: each of these is a
//! transaction of several statements.

use idem_core::steps::{Fence, NewRun, RunId, RunRecord};
use idem_core::{Operation, StoreError};
use idem_sql::decode;
use idem_sql::row::get;
use idem_sql::runs::sqlite as sql;
use idem_sql::runs::{NEVER_MS, RunWrite, Takeover};
use sqlx::{Sqlite, SqliteConnection};

use crate::pool::text_list;
use crate::{SqliteStore, SqliteTx, map_err};

idem_sql::run_store!(SqliteStore, SqliteTx, SqliteConnection, Sqlite, sqlite);

/// The fenced write, its step, its ledger mark and the key's expiry, on one
/// connection inside a transaction.
async fn record_in(conn: &mut SqliteConnection, w: RunWrite<'_>) -> Result<bool, StoreError> {
    let Some(run) = change_query(sql::UPDATE_RUN, &w)
        .fetch_optional(&mut *conn)
        .await
        .map_err(map_err)?
    else {
        return Ok(false);
    };
    if let Some(s) = w.step {
        sqlx::query(sql::UPSERT_STEP)
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
            .bind(i64::from(s.failures))
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
    }
    if let Some((message_id, state)) = w.change.message {
        sqlx::query(sql::MARK_MESSAGE)
            .bind(message_id)
            .bind(state.as_str())
            .bind(w.lease.run.as_str())
            .bind(w.now_ms)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
    }
    if let Some(expires) = w.change.expires_at_ms {
        sqlx::query(sql::KEY_EXPIRY)
            .bind(get::<String, _>(&run, "tenant_id")?)
            .bind(get::<String, _>(&run, "operation")?)
            .bind(get::<String, _>(&run, "idempotency_key")?)
            .bind(expires)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
    }
    Ok(true)
}

impl SqliteStore {
    /// A new run of the key being claimed, in the claim's transaction.
    async fn create_run_here(
        conn: &mut SqliteConnection,
        run: &NewRun<'_>,
    ) -> Result<Fence, StoreError> {
        // A final run of this id is left from a key record that expired:
        // it goes, with its steps. A live one would mean two runs of one key.
        let existing: Option<(String, i64)> = sqlx::query_as(sql::RUN_STATE)
            .bind(run.id.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(map_err)?;
        let fence = match existing {
            None => 1,
            Some((state, fence)) if state == "completed" || state == "failed" => {
                sqlx::query(sql::DELETE_RUN)
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
        new_run_query(sql::INSERT_RUN, run)
            .bind(fence)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        sqlx::query(sql::KEY_EXPIRY)
            .bind(run.scope.tenant.as_str())
            .bind(run.scope.operation.as_str())
            .bind(run.scope.key.as_str())
            .bind(NEVER_MS)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        Ok(Fence(fence))
    }

    /// A fenced write in its own `BEGIN IMMEDIATE` transaction.
    async fn record_here(&self, w: RunWrite<'_>) -> Result<bool, StoreError> {
        let mut tx = self.begin_immediate().await?;
        if !record_in(&mut tx, w).await? {
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
        t: Takeover<'_>,
    ) -> Result<Option<RunRecord>, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let row = take_over_query(id, t)
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

    /// The due runs of `operations`, taken over, with their steps, in one
    /// transaction.
    async fn claim_due_here(
        &self,
        operations: &[Operation],
        t: Takeover<'_>,
        limit: u32,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let claimed = claim_due_query(operations, t, limit)
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| self.map(e))?;
        let mut due = claimed
            .iter()
            .map(decode::run)
            .collect::<Result<Vec<_>, _>>()?;
        steps_of(&mut tx, &mut due).await?;
        self.commit_tx(tx).await?;
        due.sort_by_key(|r| r.updated_at_ms);
        Ok(due)
    }
}
