//! [`KeyStore`] for [`PgStore`]: the claim reads first on a reader
//! connection, then inserts in the caller's transaction, waiting (bounded
//! by `lock_timeout`) for a concurrent claim of the same key.

use std::time::Duration;

use idem_core::keys::{Claim, Settled, answered_by_read};
use idem_core::{
    ClaimMode, Completion, Fingerprint, KeyStore, Policy, Scope, SharedClock, StoreError,
    StoredRecord,
};
use idem_sql::decode::record;
use idem_sql::keys::{INSERT_COMPLETED, SELECT_RECORD, UPDATE_COMPLETE};
use sqlx::Postgres;

use crate::errors::map_err_waited;
use crate::{PgStore, PgTx, map_err};

idem_sql::binders!(Postgres, i32);

/// Inserts a pending record unless the key has one. `DO NOTHING` takes no row
/// lock on a committed conflicting record, so concurrent replays of one hot key
/// do not queue behind each other; it still waits (bounded by `lock_timeout`)
/// for a conflicting claim that has not committed yet.
const INSERT_CLAIM: &str = "\
INSERT INTO idem_keys (tenant_id, operation, idempotency_key, request_hash, state,
                       locked_until_ms, created_at_ms, updated_at_ms, expires_at_ms)
VALUES ($1, $2, $3, $4, 'pending', NULL, $5, $5, $6)
ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING
RETURNING 1";

/// Takes over a record that expired but was not collected yet. A concurrent
/// takeover holds the row lock; under READ COMMITTED this statement then
/// re-checks the condition against the winner's row and updates nothing.
const TAKE_OVER_EXPIRED: &str = "\
UPDATE idem_keys SET
    request_hash = $4, state = 'pending', status_code = NULL, response_headers = NULL,
    response_body = NULL, resource_type = NULL, resource_id = NULL, recovery_point = NULL,
    locked_until_ms = NULL, lock_token = NULL, created_at_ms = $5, updated_at_ms = $5,
    expires_at_ms = $6
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND expires_at_ms <= $5
RETURNING 1";

impl KeyStore for PgStore {
    type Tx = PgTx;

    async fn claim(
        &self,
        scope: &Scope,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now_ms: i64,
    ) -> Result<Claim<PgTx>, StoreError> {
        self.within(
            self.deadline_waiting(policy.wait),
            self.claim_in_tx(scope, fingerprint, policy, now_ms),
        )
        .await
    }

    async fn complete(
        &self,
        mut tx: PgTx,
        scope: &Scope,
        completion: &Completion,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let update = outcome(scoped(UPDATE_COMPLETE, scope), completion)
            .bind(now_ms)
            .execute(&mut *tx.0);
        let done = self
            .bounded(async { update.await.map_err(map_err) })
            .await?;
        if done.rows_affected() != 1 {
            return Err(StoreError::Corrupt {
                detail: "the claimed record is no longer pending".into(),
            });
        }
        self.commit_tx(tx.0).await
    }

    async fn insert_completed(
        &self,
        mut tx: PgTx,
        scope: &Scope,
        fingerprint: &Fingerprint,
        completion: &Completion,
        policy: &Policy,
        now_ms: i64,
    ) -> Result<Settled, StoreError> {
        let insert = outcome(
            scoped(INSERT_COMPLETED, scope).bind(&fingerprint.as_bytes()[..]),
            completion,
        )
        .bind(now_ms)
        .bind(policy.expires_at_ms(now_ms));
        // The insert waits for an uncommitted duplicate as a claim does.
        let existing = self
            .within(self.deadline_waiting(policy.wait), async {
                if insert
                    .fetch_optional(&mut *tx.0)
                    .await
                    .map_err(map_err)?
                    .is_some()
                {
                    return Ok(None);
                }
                // The conflicting row is locked by the INSERT and committed:
                // READ COMMITTED shows it to the next statement.
                let row = scoped(SELECT_RECORD, scope)
                    .fetch_optional(&mut *tx.0)
                    .await
                    .map_err(map_err)?;
                match row {
                    Some(row) => record(&row).map(Some),
                    None => Err(StoreError::Busy {
                        waited: Duration::ZERO,
                    }),
                }
            })
            .await?;
        match existing {
            None => self.commit_tx(tx.0).await.map(|()| Settled::Committed),
            // Dropping the transaction queues its ROLLBACK on the connection.
            Some(record) => Ok(Settled::Existing(record)),
        }
    }

    async fn begin(&self) -> Result<PgTx, StoreError> {
        self.bounded(self.begin_waiting(self.lock_timeout))
            .await
            .map(PgTx)
    }

    async fn commit(&self, tx: PgTx) -> Result<(), StoreError> {
        self.commit_tx(tx.0).await
    }

    async fn rollback(&self, tx: PgTx) -> Result<(), StoreError> {
        self.bounded(async { tx.0.rollback().await.map_err(map_err) })
            .await
    }

    async fn fetch(&self, scope: &Scope) -> Result<Option<StoredRecord>, StoreError> {
        self.bounded(self.read_first(scope)).await
    }

    async fn purge_expired(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
        self.purge(idem_sql::purge::postgres::KEYS, now_ms, limit)
            .await
    }

    /// The database server's clock ([`PgStore::database_clock`]): processes
    /// on hosts whose clocks disagree judge this store's leases alike.
    fn clock(&self) -> SharedClock {
        self.shared_clock.clone()
    }
}

impl PgStore {
    /// The claim's first step: one indexed read of the committed record,
    /// on a reader connection (no ping when it goes back; see `readers`).
    async fn read_first(&self, scope: &Scope) -> Result<Option<StoredRecord>, StoreError> {
        let binds = [
            scope.tenant.as_str().to_owned(),
            scope.operation.as_str().to_owned(),
            scope.key.as_str().to_owned(),
        ];
        let row = self
            .readers
            .fetch_optional(SELECT_RECORD, binds)
            .await
            .map_err(map_err)?;
        row.as_ref().map(record).transpose()
    }

    async fn claim_in_tx(
        &self,
        scope: &Scope,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now_ms: i64,
    ) -> Result<Claim<PgTx>, StoreError> {
        if let Some(record) = self.read_first(scope).await?
            && answered_by_read(&record, fingerprint, policy, now_ms)
        {
            return Ok(Claim::Existing(record));
        }
        let mut tx = self.begin_waiting(policy.wait).await?;
        if policy.mode == ClaimMode::Optimistic {
            return Ok(Claim::Claimed(PgTx(tx)));
        }
        let claim = |sql: &'static str| {
            scoped(sql, scope)
                .bind(&fingerprint.as_bytes()[..])
                .bind(now_ms)
                .bind(policy.expires_at_ms(now_ms))
        };
        // Between two statements a record can be collected or taken over by
        // another claim; each turn then sees a newer committed state, so a few
        // turns settle it. Usually the first statement decides.
        for _ in 0..3 {
            let inserted = claim(INSERT_CLAIM)
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| map_err_waited(e, policy.wait))?;
            if inserted.is_some() {
                return Ok(Claim::Claimed(PgTx(tx)));
            }
            // READ COMMITTED: this statement sees the row the conflicting
            // transaction committed while our INSERT waited for it.
            let row = scoped(SELECT_RECORD, scope)
                .fetch_optional(&mut *tx)
                .await
                .map_err(map_err)?;
            let Some(row) = row else { continue };
            let record = record(&row)?;
            if record.expires_at_ms > now_ms {
                tx.rollback().await.map_err(map_err)?;
                return Ok(Claim::Existing(record));
            }
            let taken = claim(TAKE_OVER_EXPIRED)
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| map_err_waited(e, policy.wait))?;
            if taken.is_some() {
                return Ok(Claim::Claimed(PgTx(tx)));
            }
        }
        tx.rollback().await.map_err(map_err)?;
        Err(StoreError::Busy {
            waited: policy.wait,
        })
    }
}
