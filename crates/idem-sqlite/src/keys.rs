//! [`KeyStore`](idem_core::KeyStore) for [`SqliteStore`], from
//! [`idem_sql::keys`]: the claim reads first without the write lock, then
//! claims in a `BEGIN IMMEDIATE` transaction behind the key's in-process
//! gate.

use idem_core::keys::{Claim, Settled, answered_by_read};
use idem_core::{ClaimMode, Completion, Scope, StoreError, StoredRecord};
use idem_sql::decode::record;
use idem_sql::keys::sqlite::INSERT_CLAIM;
use idem_sql::keys::{ClaimRequest, INSERT_COMPLETED, SELECT_RECORD};
use sqlx::Sqlite;

use crate::{SqliteStore, SqliteTx};

idem_sql::binders!(Sqlite, i64);
idem_sql::key_store!(SqliteStore, SqliteTx, sqlite);

impl SqliteStore {
    /// Read first, without the write lock (WAL readers never wait for it);
    /// then the claim, under it.
    async fn claim_here(
        &self,
        scope: &Scope,
        r: ClaimRequest<'_>,
    ) -> Result<Claim<SqliteTx>, StoreError> {
        if let Some(record) = self.read_first(scope).await?
            && answered_by_read(&record, r.fingerprint, r.policy, r.now_ms)
        {
            return Ok(Claim::Existing(record));
        }
        if r.policy.mode == ClaimMode::Optimistic {
            return self.begin_here().await.map(Claim::Claimed);
        }
        let gate = self.gates.enter(scope, r.policy.wait).await?;
        let mut tx = self.begin_immediate().await?;
        let claimed = scoped(INSERT_CLAIM, scope)
            .bind(&r.fingerprint.as_bytes()[..])
            .bind(r.now_ms)
            .bind(r.policy.expires_at_ms(r.now_ms))
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| self.map(e))?;
        if claimed.is_some() {
            let gate = Some(gate);
            return Ok(Claim::Claimed(SqliteTx { tx, _gate: gate }));
        }
        let found = self.conflict(tx, scope).await?;
        Ok(Claim::Existing(found))
    }

    /// The optimistic claim's completed record, inserted at the end of the
    /// operation's transaction (which holds the write lock).
    async fn insert_completed_here(
        &self,
        mut tx: SqliteTx,
        scope: &Scope,
        r: ClaimRequest<'_>,
        completion: &Completion,
    ) -> Result<Settled, StoreError> {
        let insert = scoped(INSERT_COMPLETED, scope).bind(&r.fingerprint.as_bytes()[..]);
        let inserted = outcome(insert, completion)
            .bind(r.now_ms)
            .bind(r.policy.expires_at_ms(r.now_ms))
            .fetch_optional(&mut *tx.tx)
            .await
            .map_err(|e| self.map(e))?;
        if inserted.is_some() {
            return self.commit_tx(tx.tx).await.map(|()| Settled::Committed);
        }
        Ok(Settled::Existing(self.conflict(tx.tx, scope).await?))
    }

    /// The record a claim conflicted with, read in the claim's transaction,
    /// which holds the write lock: it is committed and stays as read until
    /// the rollback.
    async fn conflict(
        &self,
        mut tx: sqlx::Transaction<'static, Sqlite>,
        scope: &Scope,
    ) -> Result<StoredRecord, StoreError> {
        let row = scoped(SELECT_RECORD, scope)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| self.map(e))?;
        tx.rollback().await.map_err(|e| self.map(e))?;
        match row {
            Some(row) => record(&row),
            None => Err(StoreError::Corrupt {
                detail: "conflicting key record vanished inside a write transaction".into(),
            }),
        }
    }

    idem_sql::key_tx_ends!(SqliteTx);

    /// A transaction for business writes: `BEGIN IMMEDIATE`, no gate.
    async fn begin_here(&self) -> Result<SqliteTx, StoreError> {
        let tx = self.begin_immediate().await?;
        Ok(SqliteTx { tx, _gate: None })
    }

    /// A key record, read without the write lock.
    async fn read_first(&self, scope: &Scope) -> Result<Option<StoredRecord>, StoreError> {
        let row = scoped(SELECT_RECORD, scope)
            .fetch_optional(self.pool())
            .await
            .map_err(|e| self.map(e))?;
        row.as_ref().map(record).transpose()
    }
}
