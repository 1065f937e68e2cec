//! [`KeyStore`] for [`SqliteStore`]: the claim reads first without the
//! write lock, then claims in a `BEGIN IMMEDIATE` transaction behind the
//! key's in-process gate.

use idem_core::StoredRecord;
use idem_core::keys::{Claim, Settled, answered_by_read};
use idem_core::{ClaimMode, Completion, Fingerprint, KeyStore, Policy, Scope, StoreError};
use idem_sql::decode::record;
use idem_sql::keys::{INSERT_COMPLETED, SELECT_RECORD, UPDATE_COMPLETE};
use sqlx::Sqlite;

use crate::{SqliteStore, SqliteTx};

idem_sql::binders!(Sqlite, i64);

/// A fresh claim, or the claim of a record that expired (replaced in the
/// same statement, under the write lock); a live record is left alone.
const INSERT_CLAIM: &str = "\
INSERT INTO idem_keys (tenant_id, operation, idempotency_key, request_hash, state,
                       locked_until_ms, created_at_ms, updated_at_ms, expires_at_ms)
VALUES (?1, ?2, ?3, ?4, 'pending', NULL, ?5, ?5, ?6)
ON CONFLICT (tenant_id, operation, idempotency_key) DO UPDATE SET
    request_hash = excluded.request_hash, state = 'pending', status_code = NULL,
    response_headers = NULL, response_body = NULL, resource_type = NULL,
    resource_id = NULL, recovery_point = NULL, locked_until_ms = NULL, lock_token = NULL,
    created_at_ms = excluded.created_at_ms, updated_at_ms = excluded.updated_at_ms,
    expires_at_ms = excluded.expires_at_ms
WHERE idem_keys.expires_at_ms <= excluded.created_at_ms
RETURNING 1";

impl KeyStore for SqliteStore {
    type Tx = SqliteTx;

    async fn claim(
        &self,
        scope: &Scope,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now_ms: i64,
    ) -> Result<Claim<SqliteTx>, StoreError> {
        // Read first, without the write lock: WAL readers never wait for it.
        if let Some(record) = self.fetch(scope).await?
            && answered_by_read(&record, fingerprint, policy, now_ms)
        {
            return Ok(Claim::Existing(record));
        }
        if policy.mode == ClaimMode::Optimistic {
            return self.begin().await.map(Claim::Claimed);
        }
        let gate = self.gates.enter(scope, policy.wait).await?;
        let mut tx = self.begin_immediate().await?;
        let inserted = scoped(INSERT_CLAIM, scope)
            .bind(&fingerprint.as_bytes()[..])
            .bind(now_ms)
            .bind(policy.expires_at_ms(now_ms))
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| self.map(e))?;
        if inserted.is_some() {
            return Ok(Claim::Claimed(SqliteTx {
                tx,
                _gate: Some(gate),
            }));
        }
        let row = scoped(SELECT_RECORD, scope)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| self.map(e))?;
        tx.rollback().await.map_err(|e| self.map(e))?;
        match row {
            Some(row) => Ok(Claim::Existing(record(&row)?)),
            None => Err(vanished()),
        }
    }

    async fn complete(
        &self,
        mut tx: SqliteTx,
        scope: &Scope,
        completion: &Completion,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let done = outcome(scoped(UPDATE_COMPLETE, scope), completion)
            .bind(now_ms)
            .execute(&mut *tx.tx)
            .await
            .map_err(|e| self.map(e))?;
        if done.rows_affected() != 1 {
            return Err(StoreError::Corrupt {
                detail: "the claimed record is no longer pending".into(),
            });
        }
        self.commit_tx(tx.tx).await
    }

    async fn insert_completed(
        &self,
        mut tx: SqliteTx,
        scope: &Scope,
        fingerprint: &Fingerprint,
        completion: &Completion,
        policy: &Policy,
        now_ms: i64,
    ) -> Result<Settled, StoreError> {
        let inserted = outcome(
            scoped(INSERT_COMPLETED, scope).bind(&fingerprint.as_bytes()[..]),
            completion,
        )
        .bind(now_ms)
        .bind(policy.expires_at_ms(now_ms))
        .fetch_optional(&mut *tx.tx)
        .await
        .map_err(|e| self.map(e))?;
        if inserted.is_some() {
            return self.commit_tx(tx.tx).await.map(|()| Settled::Committed);
        }
        // The transaction holds the write lock: the conflicting record is
        // committed and stays as read until the rollback.
        let row = scoped(SELECT_RECORD, scope)
            .fetch_optional(&mut *tx.tx)
            .await
            .map_err(|e| self.map(e))?;
        tx.tx.rollback().await.map_err(|e| self.map(e))?;
        match row {
            Some(row) => Ok(Settled::Existing(record(&row)?)),
            None => Err(vanished()),
        }
    }

    async fn begin(&self) -> Result<SqliteTx, StoreError> {
        Ok(SqliteTx {
            tx: self.begin_immediate().await?,
            _gate: None,
        })
    }

    async fn commit(&self, tx: SqliteTx) -> Result<(), StoreError> {
        self.commit_tx(tx.tx).await
    }

    async fn rollback(&self, tx: SqliteTx) -> Result<(), StoreError> {
        tx.tx.rollback().await.map_err(|e| self.map(e))
    }

    async fn fetch(&self, scope: &Scope) -> Result<Option<StoredRecord>, StoreError> {
        let row = scoped(SELECT_RECORD, scope)
            .fetch_optional(self.pool())
            .await
            .map_err(|e| self.map(e))?;
        row.as_ref().map(record).transpose()
    }

    async fn purge_expired(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
        self.purge(idem_sql::purge::sqlite::KEYS, now_ms, limit)
            .await
    }
}

fn vanished() -> StoreError {
    StoreError::Corrupt {
        detail: "conflicting key record vanished inside a write transaction".into(),
    }
}
